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

do
  local hw = redis.call('ZSCORE', key, 'hw')
  if hw then
    -- Checked as a number: tostring would round it to 14 digits.
    local latest = -1 - (tonumber(hw) or -1)
    if latest < 0 or latest >= 9007199254740992 or math.floor(latest) ~= latest then
      error('tower-bulwark: the state of ' .. key .. ' is not a number this crate wrote')
    end
    now = math.max(now, latest)
  end
end

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

local function save()
  local r = reset_after()
  if r > 0 then
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
  save()
  return refunded()
end

local max_wait = arg5
local total = permits()
if total + cost <= limit then
  add(now, cost)
  save()
  return decision(1, limit - total - cost, 0, reset_after(), 0, now)
end
-- The request fits once the `excess` oldest permits have left the window.
local excess = total + cost - limit
local oldest = redis.call('ZRANGEBYSCORE', key, 0, '+inf', 'WITHSCORES', 'LIMIT', excess - 1, 1)
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
-- Refused, but this script may have pruned: the latest `now` must be kept all the same.
save()
return decision(0, math.max(limit - total, 0), wait, reset_after(), 0, 0)
