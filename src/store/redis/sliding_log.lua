-- Sliding-window log on one sorted set: one member per permit, scored by the instant it was
-- admitted (or falls due, for a reservation). Members are "<instant>:<sequence>", the sequence
-- zero-padded so that members of one instant sort by it, which makes every member unique even
-- when many requests arrive in the same tick.
-- ARGV[7] window, ARGV[8] limit
local key = KEYS[1]
local window = tonumber(ARGV[7])
local limit = tonumber(ARGV[8])

-- Permits admitted at or before now - window have left the window.
redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - window))

local function last_end()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 0 then
    return 0
  end
  return stored(last[2], 0) + window
end

local function reset_after()
  return math.max(last_end() - now, 0)
end

local function save()
  local r = reset_after()
  if r > 0 then
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
  local at = arg5
  if at > now then
    local s = int(at)
    local members = redis.call('ZREVRANGEBYSCORE', key, s, s, 'LIMIT', 0, cost)
    for i = 1, #members, 1000 do
      redis.call('ZREM', key, unpack(members, i, math.min(i + 999, #members)))
    end
  end
  save()
  return 1
end

local max_wait = arg5
local total = redis.call('ZCARD', key)
if total + cost <= limit then
  add(now, cost)
  save()
  return decision(1, limit - total - cost, 0, reset_after(), 0, 0)
end
-- The request fits once the `excess` oldest permits have left the window.
local excess = total + cost - limit
local oldest = redis.call('ZRANGE', key, excess - 1, excess - 1, 'WITHSCORES')
local admit_at = now
if #oldest > 0 then
  admit_at = stored(oldest[2], 0) + window
end
local wait = math.max(admit_at - now, 0)
if wait <= max_wait then
  add(admit_at, cost)
  save()
  return decision(1, 0, 0, reset_after(), wait, admit_at)
end
return decision(0, math.max(limit - total, 0), wait, reset_after(), 0, 0)
