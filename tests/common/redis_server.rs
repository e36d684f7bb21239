//! Test helpers: a private `redis-server` (or a cluster of them) on free loopback ports, stopped
//! when dropped.
//!
//! Without a `redis-server` binary a test is skipped with a line saying why, unless
//! `BULWARK_REQUIRE_REDIS=1` (set by `.ci/run`), under which it fails.

#![allow(dead_code)] // Each test file uses a different part of the helpers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

#[cfg(feature = "redis")]
#[cfg(feature = "redis")]
use tower_bulwark::redis::{RedisAlgorithm, RedisRateLimiter, RedisStore};
#[cfg(feature = "redis")]
use tower_bulwark::Quota;

/// Whether the environment demands the Redis tests run.
fn required() -> bool {
    std::env::var("BULWARK_REQUIRE_REDIS").is_ok_and(|v| v == "1")
}

/// The first of `names` found on PATH.
fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Returns the path of `name`, or `None` after printing why the test is skipped; panics when the
/// environment requires Redis.
pub fn binary_or_skip(test: &str, name: &str) -> Option<PathBuf> {
    match find_binary(name) {
        Some(path) => Some(path),
        None if required() => panic!(
            "{test}: `{name}` is not on PATH and BULWARK_REQUIRE_REDIS=1 requires the redis tests"
        ),
        None => {
            // Straight to stderr: the test harness captures `println!` of passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: {test} because `{name}` is not on PATH \
                 (install redis-server, or run .ci/run, to run it)"
            );
            None
        }
    }
}

/// A loopback port that was free a moment ago (and, for cluster nodes, whose bus port +10000 is
/// free too).
///
/// Never one this test binary has handed out before: a server killed by one test leaves its
/// port free, and a limiter that test still holds would reconnect to another test's server
/// started there (an outage test then saw that server's admissions).
fn free_port(with_bus: bool) -> u16 {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().unwrap().port();
        if !(HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner())).insert(port) {
            continue;
        }
        if !with_bus {
            return port;
        }
        if let Some(bus) = port.checked_add(10_000) {
            if TcpListener::bind(("127.0.0.1", bus)).is_ok() {
                return port;
            }
        }
    }
}

/// A scratch directory under the system's temp dir, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "bulwark-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create a scratch dir");
        Self(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Sends one command in RESP and reads one reply line (enough for PING and CLUSTER INFO checks).
pub fn raw_command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if let Some(len) = line.strip_prefix('$') {
        let len: i64 = len.trim().parse().unwrap_or(-1);
        if len < 0 {
            return Ok(String::new());
        }
        let mut body = vec![0; len as usize + 2];
        reader.read_exact(&mut body)?;
        body.truncate(len as usize);
        return Ok(String::from_utf8_lossy(&body).into_owned());
    }
    Ok(line.trim_end().to_owned())
}

/// Polls `check` until it holds or `deadline` passes.
pub fn wait_until(what: &str, deadline: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `redis-server` process on a free loopback port, without persistence, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    binary: PathBuf,
    dir: ScratchDir,
    extra: Vec<String>,
}

impl RedisServer {
    /// A server of its own for `test` and a store connected to it: `start` and a connection.
    #[cfg(feature = "redis")]
    pub async fn with_store(test: &str) -> Option<(Self, tower_bulwark::redis::RedisStore)> {
        let server = Self::start(test)?;
        let store = tower_bulwark::redis::RedisStore::connect(&server.url())
            .await
            .unwrap();
        Some((server, store))
    }

    /// Starts a server, or returns `None` when the test must be skipped.
    pub fn start(test: &str) -> Option<Self> {
        let binary = binary_or_skip(test, "redis-server")?;
        Some(Self::start_with(&binary, free_port(false), Vec::new()))
    }

    /// A server that writes every change to its append-only file before answering, so that
    /// a restart finds the state it had.
    pub fn start_persistent(test: &str) -> Option<Self> {
        let binary = binary_or_skip(test, "redis-server")?;
        let extra = ["--appendonly", "yes", "--appendfsync", "always"];
        let extra = extra.map(String::from).to_vec();
        Some(Self::start_with(&binary, free_port(false), extra))
    }

    fn start_with(binary: &Path, port: u16, extra: Vec<String>) -> Self {
        let mut server = Self {
            child: None,
            port,
            binary: binary.to_owned(),
            dir: ScratchDir::new("redis"),
            extra,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut command = Command::new(&self.binary);
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir.0)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().expect("start redis-server");
        self.child = Some(child);
        let port = self.port;
        wait_until(
            &format!("redis-server answers on port {port}"),
            Duration::from_secs(10),
            || raw_command(port, &["PING"]).is_ok_and(|r| r == "+PONG"),
        );
    }

    /// The server's `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain connection to the server of its own, beside any store (to read and write keys
    /// as another client would).
    #[cfg(feature = "redis")]
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty (no persistence: no keys, no scripts).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Stops the server (SIGSTOP) until the guard it returns is dropped (SIGCONT): a Redis that
    /// stalls with its connections open.
    pub fn stall(&self) -> Stalled {
        let pid = self
            .child
            .as_ref()
            .expect("a running server")
            .id()
            .to_string();
        send_signal("-STOP", &pid);
        Stalled(pid)
    }

    /// Runs a command through a fresh connection and returns the first reply line.
    pub fn command(&self, args: &[&str]) -> String {
        raw_command(self.port, args).expect("redis command")
    }

    /// `EVALSHA` calls so far, from `INFO commandstats`.
    pub fn evalsha_calls(&self) -> u64 {
        let info = self.command(&["INFO", "commandstats"]);
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    }
}

/// A server stopped by [`RedisServer::stall`], resumed when this is dropped (however the test
/// ends).
pub struct Stalled(String);

impl Drop for Stalled {
    fn drop(&mut self) {
        send_signal("-CONT", &self.0);
    }
}

fn send_signal(signal: &str, pid: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, pid])
        .status();
    assert!(status.is_ok_and(|s| s.success()), "kill {signal} {pid}");
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of three masters on free loopback ports.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers and joins them, or returns `None` to skip.
    pub fn start(test: &str) -> Option<Self> {
        let server = binary_or_skip(test, "redis-server")?;
        let cli = binary_or_skip(test, "redis-cli")?;
        let nodes: Vec<RedisServer> = (0..3)
            .map(|i| {
                let port = free_port(true);
                RedisServer::start_with(
                    &server,
                    port,
                    vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        format!("nodes-{port}-{i}.conf"),
                        "--cluster-node-timeout".into(),
                        "5000".into(),
                    ],
                )
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        for node in &nodes {
            let port = node.port;
            wait_until(
                &format!("cluster node {port} says cluster_state:ok"),
                Duration::from_secs(30),
                || {
                    raw_command(port, &["CLUSTER", "INFO"])
                        .is_ok_and(|info| info.contains("cluster_state:ok"))
                },
            );
        }
        Some(Self { nodes })
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

/// Polls `check` from async code (yielding to the runtime between polls) until it holds or
/// `deadline` passes.
pub async fn eventually(what: &str, deadline: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A fake Redis on a loopback port: it answers `+OK` to every command except `EVALSHA` and
/// `EVAL`, which get `reply` verbatim (RESP), so a client sees a script reply of any shape.
pub struct FakeRedis {
    port: u16,
}

impl FakeRedis {
    /// Starts the fake on a thread; it lives until the test process ends.
    pub fn start(reply: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake redis");
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                std::thread::spawn(move || {
                    let _ = serve_fake(stream, reply);
                });
            }
        });
        Self { port }
    }

    /// The fake's `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

fn serve_fake(stream: TcpStream, reply: &str) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let count: usize = line
            .trim_end()
            .strip_prefix('*')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not a RESP array: {line:?}")))?;
        let mut args = Vec::with_capacity(count);
        for _ in 0..count {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            let len: usize = header
                .trim_end()
                .strip_prefix('$')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| std::io::Error::other(format!("not a bulk string: {header:?}")))?;
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            args.push(String::from_utf8_lossy(&body).to_uppercase());
        }
        let answer = match args.first().map(String::as_str) {
            Some("EVALSHA" | "EVAL") => reply,
            _ => "+OK\r\n",
        };
        writer.write_all(answer.as_bytes())?;
    }
}

/// Everything a Redis key holds, in a comparable form (expiries aside): its type, then its
/// value, its hash fields (sorted) or its sorted-set members with their scores.
#[cfg(feature = "redis")]
pub async fn key_state(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap();
    let mut out = vec![kind.clone()];
    match kind.as_str() {
        "none" => {}
        "string" => out.push(redis::cmd("GET").arg(key).query_async(conn).await.unwrap()),
        "hash" => {
            let mut pairs: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(conn)
                .await
                .unwrap();
            pairs.sort();
            out.extend(pairs.into_iter().map(|(k, v)| format!("{k}={v}")));
        }
        "zset" => {
            let members: Vec<(String, String)> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(conn)
                .await
                .unwrap();
            out.extend(members.into_iter().map(|(m, s)| format!("{m}@{s}")));
        }
        other => panic!("unexpected type {other}"),
    }
    out
}

/// Whether a Redis limiter keeps refusals in its local cache (the default) or asks Redis for
/// every decision.
#[cfg(feature = "redis")]
#[derive(Clone, Copy)]
pub enum Refusals {
    Cached,
    Uncached,
}

/// What `$started` (a [`RedisServer`] starting) gives, or a return from the test where no Redis
/// can start on this machine and none is required (see [`binary_or_skip`]):
/// `let server = or_skip!(RedisServer::start("name"));`.
#[allow(unused_macros)]
macro_rules! or_skip {
    ($started:expr) => {
        match $started {
            Some(started) => started,
            None => return,
        }
    };
}
#[allow(unused_imports)]
pub(crate) use or_skip;

/// The builder of a Redis limiter of algorithm `A` for `quota` on `store`, its keys under
/// `prefix`, reading the client clock `clock`, that fails with Redis's error (neither open nor
/// closed) and waits up to 5 s for an answer (so no admission is the fail mode's), its refusals
/// cached or not.
#[cfg(feature = "redis")]
pub fn propagating<A: tower_bulwark::redis::RedisAlgorithm>(
    store: &tower_bulwark::redis::RedisStore,
    quota: tower_bulwark::Quota,
    clock: &(impl tower_bulwark::clock::Clock + Clone),
    prefix: &str,
    refusals: Refusals,
) -> tower_bulwark::redis::RedisRateLimiterBuilder {
    let builder = tower_bulwark::redis::RedisRateLimiter::builder(quota, store.clone())
        .algorithm::<A>()
        .client_clock(clock.clone())
        .prefix(prefix)
        .fail_mode(tower_bulwark::redis::RedisFailMode::Propagate)
        .timeout(Duration::from_secs(5));
    match refusals {
        Refusals::Cached => builder,
        Refusals::Uncached => builder.refusal_cache_capacity(0),
    }
}

/// A Redis limiter of [`propagating`]'s, its refusals not cached (every decision asks Redis),
/// built.
#[cfg(feature = "redis")]
pub fn uncached<A: RedisAlgorithm>(
    store: &RedisStore,
    quota: Quota,
    clock: &(impl tower_bulwark::clock::Clock + Clone),
    prefix: &str,
) -> RedisRateLimiter {
    propagating::<A>(store, quota, clock, prefix, Refusals::Uncached)
        .build()
        .unwrap()
}

/// The error that a limiter of 5 a second on `fake`, propagating failures, gets for a
/// reservation; after it, a limiter that fails open on the same server admits a check and
/// counts its one failure.
#[cfg(feature = "redis")]
pub async fn failure_then_open(fake: &FakeRedis) -> tower_bulwark::BoxError {
    use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
    use tower_bulwark::{Limiter, Quota};
    let store = RedisStore::connect(&fake.url()).await.unwrap();
    let limiter = |mode| {
        RedisRateLimiter::builder(Quota::per_second(5).unwrap(), store.clone())
            .fail_mode(mode)
            .build()
            .unwrap()
    };
    let err = limiter(RedisFailMode::Propagate)
        .reserve(&"k", 1)
        .await
        .unwrap_err();
    let open = limiter(RedisFailMode::Open);
    assert!(open.check(&"k").await.unwrap().allowed);
    assert_eq!(open.counts().failures, 1);
    err
}
