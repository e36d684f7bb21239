-- tower-bulwark: shared prelude of every limiter script.
--
-- Every time and duration is an integer number of ticks: microseconds when the time comes from
-- the server's TIME, nanoseconds when the client passes its own clock (tests). Lua 5.1 numbers
-- are doubles, exact for integers below 2^53; the client checks that every value it sends keeps
-- the arithmetic below that bound, and the helpers below round exactly like the Rust code.
--
-- ARGV[1] operation: 'd' decide, 'r' refund, 'c' charge (a forced admission: what a settled
--         request cost beyond its estimate; never refused, debt beyond what is left), 'l'
--         lease (a share of the permits that an instance admits from without asking), 'e' end
--         a lease (its unused permits go back), 's' settle a hold, 'k' renew holds (the
--         scripts that hold: `holds.lua`)
-- ARGV[2] now in ticks, or '' to read the server's TIME (in microseconds)
-- ARGV[3] ticks per millisecond (for key expiries)
-- ARGV[4] cost in permits
-- ARGV[5] decide: longest wait a caller accepts; refund: instant the admission was charged at;
--         charge and give back: 0; lease: how long Redis keeps the lease; settle: the estimate
-- ARGV[6] milliseconds added to every expiry: 0 with the server's TIME; with a client clock,
--         whose pace need not match the server's, a margin so no state expires while it matters
-- ARGV[7] deadline in the server's TIME (microseconds), or '' for none: a script that runs
--         later than it changes nothing and answers 'late', since its caller was answered
--         without it
-- ARGV[8..] the algorithm's own parameters, then for a lease: the share wanted (at least the
--         cost, ARGV[4]), the new lease's id, the id of a lease ended in the same call (0 for
--         none) and its unused permits; for an end: the unused permits and the id
--
-- Replies, each led by its status (`Reply` in src/redis/reply.rs reads them; literals
-- here, since a Lua local costs every call instructions) and ending with the server's TIME in
-- microseconds (the client's clock offset):
--   decision: { 0 refused or 1 admitted, remaining, retry_after, reset_after, wait, reserved_at,
--             time }; GCRA and the sliding counter: { ..., reserved_at, state_after (what an
--             admission left: the TAT; the windows' numbering plus one), time }
--   late:     { 2, time }
--   refund, charge or lease end (applied): { 3, time }
--   lease:    { 4, permits, start, end, remaining, time }

if redis.replicate_commands then
  -- Redis 3.2 and 4 need effects replication to write after reading TIME; later it is a no-op.
  redis.replicate_commands()
end
local server_time
do
  local t = redis.call('TIME')
  server_time = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A non-negative integer below 2^53 given as an argument, or nil. Checked as a number, not
-- matched as a string of digits: a pattern match costs a script call about as much as a command.
local function count_arg(value)
  local n = tonumber(value)
  if not n or n < 0 or n >= 9007199254740992 or n % 1 ~= 0 then
    return nil
  end
  return n
end

local op = ARGV[1]
local now
if ARGV[2] == '' then
  now = server_time
else
  now = count_arg(ARGV[2])
end
local ticks_per_ms = count_arg(ARGV[3])
local cost = count_arg(ARGV[4])
local arg5 = count_arg(ARGV[5])
-- Milliseconds added to every expiry; more than zero with a client clock, whose keys are then
-- never deleted for holding nothing more: one that existed keeps its latest reading for the
-- margin, so that a reading older than it (another instance's clock behind this one's) is
-- decided as of it, as in memory, where the store raises its floor before it drops a key. A key
-- that did not exist is not made for nothing (a give-back on a key gone, a cost of zero). Each
-- script works out `kept` once and gives it to every `save`: read inside `save`, the two
-- values cost a GCRA decision 0.5 % more instructions (`benches/redis_instructions.sh`).
local ttl_margin = count_arg(ARGV[6])
local deadline = nil
if ARGV[7] ~= '' then
  deadline = count_arg(ARGV[7])
  if not deadline then
    return redis.error_reply('tower-bulwark: malformed script arguments')
  end
end

-- floor(a / b) for integers 0 <= a, 0 < b below 2^53, exact despite floating point division.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b), same domain.
local function cdiv(a, b)
  return idiv(a + b - 1, b)
end

-- An integer below 2^53 as a decimal string: '%d' formats it as a 64-bit C long, exactly
-- (tostring would switch to exponents above 1e14, and '%.0f' costs three times as much).
local function int(x)
  return string.format('%d', x)
end

-- An expiry `ticks` ticks from now, in whole milliseconds rounded up, at least one, plus the
-- margin.
local function expiry_ms(ticks)
  local ms = cdiv(ticks, ticks_per_ms)
  if ms < 1 then
    ms = 1
  end
  return int(ms + ttl_margin)
end

-- Keeps `key` for `ticks` more ticks (see `expiry_ms`).
local function expire_in(key, ticks)
  redis.call('PEXPIRE', key, expiry_ms(ticks))
end

-- A number read back from stored state: only a non-negative integer below 2^53 is state this
-- crate wrote ('1.5', '-3', 'inf', 'nan' or '1e300' would break the arithmetic); anything
-- else is corrupt state and fails the script.
local function stored(value, default)
  if not value then
    return default
  end
  local n = tonumber(value)
  -- Scores come back in whatever notation the server prints doubles in: check the value.
  if not n or n < 0 or n >= 9007199254740992 or n % 1 ~= 0 then
    error('tower-bulwark: the state of ' .. KEYS[1] .. ' is not a number this crate wrote')
  end
  return n
end

-- The decision as the client parses it: seven integers, or eight for GCRA and the sliding
-- counter, whose decisions also carry what an admission left (zero for a refusal) before the
-- time.
local function decision(allowed, remaining, retry_after, reset_after, wait, reserved_at, state_after)
  if state_after then
    return { allowed, remaining, retry_after, reset_after, wait, reserved_at, state_after, server_time }
  end
  return { allowed, remaining, retry_after, reset_after, wait, reserved_at, server_time }
end

-- The reply of an applied refund or charge.
local function refunded()
  return { 3, server_time }
end

if not now or not ticks_per_ms or ticks_per_ms == 0 or not cost or not arg5 or not ttl_margin then
  return redis.error_reply('tower-bulwark: malformed script arguments')
end
-- A lease's arguments, the last of ARGV (see above): `lease_back` and `lease_unused` are the
-- lease that ends, for a lease and for an end alike.
local lease_wanted, lease_id, lease_back, lease_unused
if op == 'l' then
  lease_wanted, lease_id = count_arg(ARGV[#ARGV - 3]), count_arg(ARGV[#ARGV - 2])
  lease_back, lease_unused = count_arg(ARGV[#ARGV - 1]), count_arg(ARGV[#ARGV])
  if not lease_wanted or not lease_id or lease_id == 0 or not lease_back or not lease_unused
      or lease_wanted < cost or arg5 < 1 then
    return redis.error_reply('tower-bulwark: malformed script arguments')
  end
elseif op == 'e' then
  lease_unused, lease_back = count_arg(ARGV[#ARGV - 1]), count_arg(ARGV[#ARGV])
  if not lease_unused or not lease_back then
    return redis.error_reply('tower-bulwark: malformed script arguments')
  end
end

-- The leases a key's state keeps, ";<id>,<permits>,<mark>" each (the mark: when it ends, for
-- GCRA; the window that counted it, for the window algorithms), by id: { permits, mark }.
local function read_leases(raw)
  local leases = {}
  for id, permits, mark in string.gmatch(raw or '', ';([^,;]*),([^,;]*),([^,;]*)') do
    leases[stored(id, 0)] = { stored(permits, 0), stored(mark, 0) }
  end
  return leases
end

local function write_leases(leases)
  local parts = {}
  for id, lease in pairs(leases) do
    parts[#parts + 1] = ';' .. int(id) .. ',' .. int(lease[1]) .. ',' .. int(lease[2])
  end
  return table.concat(parts)
end

-- Whether `leases` has room for the new lease: at most 64 out at once, and its id not among
-- them.
local function lease_room(leases)
  local count = 0
  for _ in pairs(leases) do
    count = count + 1
  end
  return count < 64 and not leases[lease_id]
end

if deadline and server_time > deadline then
  -- The caller stopped waiting before this script ran: it has its answer, so nothing changes.
  return { 2, server_time }
end
