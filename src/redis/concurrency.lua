-- tower-bulwark: the slots of a concurrent policy (src/redis/concurrency.rs).
--
-- One sorted set per client key. Each slot a request holds is one member, named
-- '<request id>:<n>' (the request id is '<instance>:<sequence>', unique to the admission), and
-- scored by the instant it expires unless its instance renews it. Times are integer ticks:
-- microseconds of the server's TIME, or nanoseconds of a client clock (tests). A slot whose
-- expiry has passed no longer counts, so the slots of an instance that died come back.
--
-- ARGV[1] 'a' acquire, 'r' release, 'k' keep (renew)
-- ARGV[2] now in ticks, or '' to read the server's TIME
-- ARGV[3] ticks per millisecond (for key expiries)
-- ARGV[4] milliseconds added to every key expiry (a client clock's margin, else 0)
-- ARGV[5] how long a slot lives without renewal, in ticks
-- then, for each key of KEYS in order, its requests: their count, then for each its id and the
-- first and last of its slots (acquire and release: one key, one request)
-- ARGV[last] acquire only: the most slots the key may hold
--
-- Replies: acquire { 1 admitted or 0 refused, the slots left free }; release and keep
-- { 2, the slots found }. A key of another type fails the script with Redis's WRONGTYPE error.

if redis.replicate_commands then
  -- Redis 3.2 and 4 need effects replication to write after reading TIME; later it is a no-op.
  redis.replicate_commands()
end

-- A non-negative integer below 2^53, or nil.
local function count_arg(value)
  local n = tonumber(value)
  if not n or n < 0 or n >= 9007199254740992 or n % 1 ~= 0 then
    return nil
  end
  return n
end

local function malformed()
  return redis.error_reply('tower-bulwark: malformed concurrency script arguments')
end

local op = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = count_arg(ARGV[2])
end
local ticks_per_ms = count_arg(ARGV[3])
local ttl_margin = count_arg(ARGV[4])
local lifetime = count_arg(ARGV[5])
if not now or not ticks_per_ms or ticks_per_ms == 0 or not ttl_margin or not lifetime
    or lifetime == 0 then
  return malformed()
end
local expires = string.format('%d', now + lifetime)
local expiry_ms = math.ceil(lifetime / ticks_per_ms) + ttl_margin

-- The requests of each key: { key, { id, first, last }... }, or nil for malformed arguments.
local function requests()
  local keys, i = {}, 6
  for k = 1, #KEYS do
    local count = count_arg(ARGV[i])
    if not count then
      return nil
    end
    local list = {}
    for r = 1, count do
      local id, first, last = ARGV[i + 3 * r - 2], count_arg(ARGV[i + 3 * r - 1]),
          count_arg(ARGV[i + 3 * r])
      if not id or id == '' or not first or not last or first < 1 or last + 1 < first then
        return nil
      end
      list[r] = { id, first, last }
    end
    keys[k] = { KEYS[k], list }
    i = i + 1 + 3 * count
  end
  local extra = (op == 'a') and 1 or 0
  if i + extra ~= #ARGV + 1 then
    return nil
  end
  return keys
end

-- Keeps `key` at least until its latest slot expires (never shortens it: a clock read later
-- may be behind one read earlier).
local function keep_key(key)
  if redis.call('PTTL', key) < expiry_ms then
    redis.call('PEXPIRE', key, string.format('%d', expiry_ms))
  end
end

local keys = requests()
if not keys then
  return malformed()
end

if op == 'a' then
  local limit = count_arg(ARGV[#ARGV])
  if #keys ~= 1 or #keys[1][2] ~= 1 or not limit then
    return malformed()
  end
  local key, request = keys[1][1], keys[1][2][1]
  -- Slots whose instance stopped renewing them have expired: they count no more.
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
  local held = redis.call('ZCARD', key)
  local wanted = request[3] - request[2] + 1
  if held + wanted > limit then
    return { 0, math.max(limit - held, 0) }
  end
  local args = {}
  for n = request[2], request[3] do
    args[#args + 1] = expires
    args[#args + 1] = request[1] .. ':' .. n
    if #args >= 1000 then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', key, unpack(args))
  end
  keep_key(key)
  return { 1, limit - held - wanted }
end

if op == 'r' then
  if #keys ~= 1 or #keys[1][2] ~= 1 then
    return malformed()
  end
  local key, request = keys[1][1], keys[1][2][1]
  local members = {}
  for n = request[2], request[3] do
    members[#members + 1] = request[1] .. ':' .. n
  end
  local removed = 0
  for i = 1, #members, 1000 do
    removed = removed + redis.call('ZREM', key, unpack(members, i, math.min(i + 999, #members)))
  end
  return { 2, removed }
end

if op == 'k' then
  -- Only slots still held are renewed: one given back, or taken by another request once it
  -- expired, is never brought back.
  local kept = 0
  for _, entry in ipairs(keys) do
    local key, found = entry[1], 0
    for _, request in ipairs(entry[2]) do
      for n = request[2], request[3] do
        local member = request[1] .. ':' .. n
        if redis.call('ZSCORE', key, member) then
          redis.call('ZADD', key, expires, member)
          found = found + 1
        end
      end
    end
    if found > 0 then
      keep_key(key)
    end
    kept = kept + found
  end
  return { 2, kept }
end

return malformed()
