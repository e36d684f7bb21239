-- Sliding-window log on one sorted set: one member per permit, scored by the instant it was
-- admitted (or falls due, for a reservation). Members are "<instant>:<sequence>", the sequence
-- zero-padded so that members of one instant sort by it, which makes every member unique even
-- when many requests arrive in the same tick.
--
-- One more member, 'hw', has the negative score -1 - (the latest `now` any script used), so that
-- it never meets the permits' scores (all >= 0). A script whose `now` is older (a stale client
-- clock, or a server clock stepped back) decides at that latest instant instead: permits that an
-- earlier script pruned as out of the window would otherwise be missing from its count, and it
-- could admit more than the limit within one window.
-- ARGV[8] window, ARGV[9] limit
local key = KEYS[1]
local window = tonumber(ARGV[8])
local limit = tonumber(ARGV[9])

local hw = redis.call('ZSCORE', key, 'hw')
do
  if hw then
    -- Checked as a number: tostring would round it to 14 digits.
    local latest = -1 - (tonumber(hw) or -1)
    if latest < 0 or latest >= 9007199254740992 or math.floor(latest) ~= latest then
      error('tower-bulwark: the state of ' .. key .. ' is not a number this crate wrote')
    end
    now = math.max(now, latest)
  end
end
-- With a client clock, a key that existed is kept when it holds nothing more (`prelude.lua`):
-- given to each `save`, not read in it.
local kept = ttl_margin > 0 and hw

-- Permits admitted at or before now - window have left the window.
if now >= window then
  redis.call('ZREMRANGEBYSCORE', key, 0, int(now - window))
end

-- The number of permits in the log.
local function permits()
  return redis.call('ZCOUNT', key, 0, '+inf')
end

local function last_end()
  local last = redis.call('ZREVRANGEBYSCORE', key, '+inf', 0, 'WITHSCORES', 'LIMIT', 0, 1)
  if #last == 0 then
    return 0
  end
  return stored(last[2], 0) + window
end

local function reset_after()
  return math.max(last_end() - now, 0)
end

local function save(keep)
  local r = reset_after()
  if r > 0 or keep then
    redis.call('ZADD', key, int(-1 - now), 'hw')
    expire_in(key, r)
  else
    redis.call('DEL', key)
  end
end

-- Records `n` permits at instant `at`.
local function add(at, n)
  local s = int(at)
  local next_seq = 0
  local top = redis.call('ZREVRANGEBYSCORE', key, s, s, 'LIMIT', 0, 1)
  if #top > 0 then
    local seq = tonumber(string.match(top[1], ':(%d+)$'))
    if not seq then
      error('tower-bulwark: the log ' .. key .. ' holds a foreign member')
    end
    next_seq = seq + 1
  end
  local args = {}
  for i = 0, n - 1 do
    args[#args + 1] = s
    args[#args + 1] = s .. ':' .. string.format('%010d', next_seq + i)
    if #args >= 1000 then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', key, unpack(args))
  end
end

if op == 'r' then
  -- The permits charged at that instant, if still in the log: past or future.
  local s = int(arg5)
  local members = redis.call('ZREVRANGEBYSCORE', key, s, s, 'LIMIT', 0, cost)
  for i = 1, #members, 1000 do
    redis.call('ZREM', key, unpack(members, i, math.min(i + 999, #members)))
  end
  save(kept)
  return refunded()
end

if op == 'c' then
  -- The charge's permits at now, past the limit if it must.
  add(now, cost)
  save(kept)
  return refunded()
end

-- The earliest instant t >= now at which `cost` fits, and the count that weighs on an admission
-- at now (the fullest window containing now), as the in-memory log finds them.
--
-- A new permit at t lies in the windows (x - window, x] for x in [t, t + window). Their counts
-- change only where a permit enters or leaves, so the fullest is the one ending at t or at a
-- permit inside (t, t + window); and the earliest feasible t is now or an instant at which a
-- permit leaves. Without permits ahead of now (no reservation), the window ending at t is the
-- fullest and the answer is the instant the excess oldest permits have left.
local function earliest()
  local room = limit - cost
  local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', 0, 'WITHSCORES', 'LIMIT', 0, 1)
  if #newest == 0 or stored(newest[2], 0) <= now then
    local total = permits()
    if total <= room then
      return now, total
    end
    local excess = total - room
    local oldest = redis.call('ZRANGEBYSCORE', key, 0, '+inf', 'WITHSCORES', 'LIMIT', excess - 1, 1)
    return stored(oldest[2], 0) + window, total
  end
  -- Entries (instant, permits), oldest first, and their prefix sums.
  local raw = redis.call('ZRANGEBYSCORE', key, 0, '+inf', 'WITHSCORES')
  local ts, ks = {}, {}
  for i = 2, #raw, 2 do
    local t = stored(raw[i], 0)
    if #ts > 0 and ts[#ts] == t then
      ks[#ks] = ks[#ks] + 1
    else
      ts[#ts + 1] = t
      ks[#ks + 1] = 1
    end
  end
  local n = #ts
  local prefix = { [0] = 0 }
  for i = 1, n do
    prefix[i] = prefix[i - 1] + ks[i]
  end
  -- ending[i]: the count of the window (ts[i] - window, ts[i]].
  local ending = {}
  local lo = 1
  for i = 1, n do
    while ts[lo] + window <= ts[i] do
      lo = lo + 1
    end
    ending[i] = prefix[i] - prefix[lo - 1]
  end
  -- Sweep the candidates in order: lo = first permit still in (t - window, t], hi = first
  -- permit after t, up = first permit at or after t + window; a monotone queue holds the
  -- fullest window ending at a permit inside (t, t + window).
  local hi, up = 1, 1
  lo = 1
  local queue, head, tail = {}, 1, 0
  local need_now = nil
  local function fits(t)
    while lo <= n and ts[lo] + window <= t do
      lo = lo + 1
    end
    while hi <= n and ts[hi] <= t do
      hi = hi + 1
    end
    while up <= n and ts[up] < t + window do
      while tail >= head and ending[queue[tail]] <= ending[up] do
        tail = tail - 1
      end
      tail = tail + 1
      queue[tail] = up
      up = up + 1
    end
    while tail >= head and queue[head] < hi do
      head = head + 1
    end
    local need = prefix[hi - 1] - prefix[lo - 1]
    if tail >= head and ending[queue[head]] > need then
      need = ending[queue[head]]
    end
    if need_now == nil then
      need_now = need
    end
    return need <= room
  end
  if fits(now) then
    return now, need_now
  end
  for i = 1, n do
    local t = ts[i] + window
    if t > now and fits(t) then
      return t, need_now
    end
  end
  error('tower-bulwark: no instant fits in ' .. key)
end

local max_wait = arg5
local admit_at, need_now = earliest()
local wait = admit_at - now
if wait == 0 then
  add(now, cost)
  save(kept)
  return decision(1, limit - need_now - cost, 0, reset_after(), 0, now)
end
if wait <= max_wait then
  add(admit_at, cost)
  save(kept)
  return decision(1, 0, 0, reset_after(), wait, admit_at)
end
-- Refused, but this script may have pruned: the latest `now` must be kept all the same.
save(kept)
return decision(0, math.max(limit - need_now, 0), wait, reset_after(), 0, 0)
