-- Fixed window with Resilience4j's cycles, counted from tick zero, on one hash:
-- c = the last cycle seen, u = permits used in it (above the limit: debt of later cycles),
-- l = the latest clock reading; an older reading is decided as of it; d = the period `c` counts
-- in (absent: the current period).
-- ARGV[8] period, ARGV[9] limit
local key = KEYS[1]
local period = tonumber(ARGV[8])
local limit = tonumber(ARGV[9])
local state = redis.call('HMGET', key, 'c', 'u', 'l', 'd')
local c = stored(state[1], 0)
local u = stored(state[2], 0)
local latest = stored(state[3], 0)
now = math.max(now, latest)
-- The quota's period changed since the key was written: its count moves, whole, to the cycle of
-- this period that holds its latest reading, and is refreshed from there like any other.
if stored(state[4], period) ~= period then
  c = idiv(latest, period)
end

-- Refresh: every cycle that started since `c` grants `limit` permits.
local cycle = idiv(now, period)
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
    redis.call('HSET', key, 'c', int(c), 'u', int(u), 'l', int(now), 'd', int(period))
    expire_in(key, reset_after())
  end
end

if op == 'r' then
  -- The count is one queue of slots, `limit` per cycle from the current one. A charge (ARGV[5])
  -- due in a cycle that has ended is spent: the debt carried out of it holds only later
  -- charges. A charge the count can tell lies wholly inside the last cycle with charges (any
  -- immediate admission while no reservation is outstanding, any reservation of one permit due
  -- in it) is given back exactly; any other is kept (lost, never over-granted): one due earlier
  -- lies before later charges, and a reservation of several permits may begin in the cycle
  -- before the one it falls due in. As in memory.
  local charged = idiv(arg5, period)
  if u > 0 and charged >= c then
    local last = c + idiv(u - 1, limit)
    if charged == last and (u <= limit or cost == 1) then
      u = math.max(u - cost, 0)
    end
  end
  save()
  return refunded()
end

if op == 'c' then
  -- The count of this cycle grows, past the limit if it must: debt the next cycles pay.
  u = u + cost
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
