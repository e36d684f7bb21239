-- Fixed window with Resilience4j's cycles, counted from tick zero, on one hash:
-- c = the last cycle seen, u = permits used in it (above the limit: debt of later cycles).
-- ARGV[8] period, ARGV[9] limit
local key = KEYS[1]
local period = tonumber(ARGV[8])
local limit = tonumber(ARGV[9])
local state = redis.call('HMGET', key, 'c', 'u')
local c = stored(state[1], 0)
local u = stored(state[2], 0)

-- Refresh: every cycle that started since `c` grants `limit` permits.
local cycle = idiv(math.max(now, 0), period)
if cycle > c then
  u = math.max(u - (cycle - c) * limit, 0)
  c = cycle
end

-- Ticks from now until `n` more cycles have started (the first at the next boundary).
local function until_cycles(n)
  if n == 0 then
    return 0
  end
  return (c + n) * period - now
end

local function reset_after()
  return until_cycles(cdiv(u, limit))
end

local function save()
  if u == 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'c', int(c), 'u', int(u))
    expire_in(key, reset_after())
  end
end

if op == 'r' then
  -- Whenever the admission was charged, past or future: k cycles later the state holds
  -- max(u_before + cost - k * limit, 0), and taking the cost off (not below zero) leaves
  -- max(u_before - k * limit, 0), exactly the state had it never been admitted.
  u = math.max(u - cost, 0)
  save()
  return refunded()
end

local max_wait = arg5
if u + cost <= limit then
  u = u + cost
  save()
  return decision(1, limit - u, 0, reset_after(), 0, now)
end
local wait = until_cycles(cdiv(u + cost - limit, limit))
if wait <= max_wait then
  u = u + cost
  save()
  return decision(1, 0, 0, reset_after(), wait, now + wait)
end
return decision(0, math.max(limit - u, 0), wait, reset_after(), 0, 0)
