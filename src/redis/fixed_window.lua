-- Fixed window with Resilience4j's cycles, counted from tick zero, on one hash:
-- c = the last cycle seen, u = permits used in it (above the limit: debt of later cycles),
-- l = the latest clock reading; an older reading is decided as of it; d = the period `c` counts
-- in (absent: the current period); v = the latest instant a reservation falls due (until then a
-- count above the limit may hold a waiting caller's slots; afterwards it is only debt); s = the
-- limit in force when `v` was written (absent: the current limit).
-- ARGV[8] period, ARGV[9] limit
--
-- Leases (ops 'l' and 'e', arguments in `prelude.lua`): a share of the current cycle's permits,
-- counted in `u` at once and admitted from only until the cycle ends, so every cycle admits no
-- more than its limit, however the instances spend their shares. x = the leases of cycle `c`,
-- so that one coming back with unused permits while no debt is carried gives them back
-- exactly; after its cycle, a lease's permits are spent.
local key = KEYS[1]
local period = tonumber(ARGV[8])
local limit = tonumber(ARGV[9])
local state = redis.call('HMGET', key, 'c', 'u', 'l', 'd', 'x', 'v', 's')
local c = stored(state[1], 0)
local u = stored(state[2], 0)
local latest = stored(state[3], 0)
local leases = read_leases(state[5])
local reserved_until = stored(state[6], 0)
now = math.max(now, latest)
-- With a client clock, a key that existed is kept when it holds nothing more (`prelude.lua`):
-- given to each `save`, not read in it.
local kept = ttl_margin > 0 and state[3]
-- The quota's period changed since the key was written: its count moves, whole, to the cycle of
-- this period that holds its latest reading, and is refreshed from there like any other.
local moved = stored(state[4], period) ~= period
if moved then
  c = idiv(latest, period)
end
-- Reservations ahead slotted by a quota since changed (its limit `s`, its period `d`): the count
-- grows by what this quota frees more than that one until the last of them falls due, so that
-- none of their slots is freed before (`limit - s` a cycle for a raised limit, nothing for a
-- lowered one; `limit` a cycle after a change of period), below 2^53. As in memory, which keeps
-- the count so laid out when it refuses too: so a refusal saves it here.
local relaid = reserved_until > latest and (moved or stored(state[7], limit) ~= limit)
if relaid then
  local per_cycle = limit
  if not moved then
    per_cycle = math.max(limit - stored(state[7], limit), 0)
  end
  u = math.max(u, math.min(u + per_cycle * (idiv(reserved_until, period) - c), 9007199254740991))
end

-- Refresh: every cycle that started since `c` grants `limit` permits.
local cycle = idiv(now, period)
if cycle > c then
  u = math.max(u - (cycle - c) * limit, 0)
  c = cycle
  leases = {}
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

local function save(keep)
  if u == 0 and not keep then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'c', int(c), 'u', int(u), 'l', int(now), 'd', int(period), 'x', write_leases(leases))
    -- A reservation ahead holds slots beyond the limit: with none, nothing is outstanding.
    if u > limit and reserved_until > now then
      redis.call('HSET', key, 'v', int(reserved_until), 's', ARGV[9])
    elseif state[6] then
      redis.call('HDEL', key, 'v', 's')
    end
    expire_in(key, reset_after())
  end
end

-- Ends the lease `id`, its `unused` permits back in this cycle, if it is one of it and no debt is
-- carried (a charge beyond the limit holds the last slots; taking earlier ones out would move
-- it into this cycle).
local function end_lease(id, unused)
  local lease = leases[id]
  if not lease then
    return
  end
  leases[id] = nil
  if u <= limit then
    u = math.max(u - math.min(unused, lease[1]), 0)
  end
end

if op == 'e' then
  end_lease(lease_back, lease_unused)
  save(kept)
  return refunded()
end

if op == 'l' then
  -- The lease this call ends, if it names one (id 0: none).
  end_lease(lease_back, lease_unused)
  local length, wanted = arg5, lease_wanted
  local available = math.max(limit - u, 0)
  if available < cost or not lease_room(leases) then
    -- Nothing leased: when the next cycles give `cost` permits.
    if lease_back > 0 or relaid then
      save(kept)
    end
    local wait = math.max(until_cycles(cdiv(u + cost - limit, limit)), 1)
    return decision(0, available, wait, reset_after(), 0, 0)
  end
  local permits = math.min(wanted, available)
  u = u + permits
  leases[lease_id] = { permits, c }
  save(kept)
  local ends = math.min(now + length, (c + 1) * period)
  return { 4, permits, now, ends, limit - u, server_time }
end

if op == 'r' then
  -- The count is one queue of slots, `limit` per cycle from the current one. A charge (ARGV[5])
  -- due in a cycle that has ended is spent: the debt carried out of it holds only later
  -- charges. A charge the count can tell lies wholly inside the last cycle with charges (any
  -- immediate admission while no reservation is outstanding, any reservation of one permit due
  -- in it) is given back exactly; any other is kept (lost, never over-granted): one due earlier
  -- lies before later charges, and a reservation of several permits may begin in the cycle
  -- before the one it falls due in. An immediate admission of this cycle (ARGV[11] '0'), while
  -- no reservation of the key is still to fall due, comes back whole whatever debt a settle left
  -- beyond it: debt holds no caller's slot. As in memory.
  local charged = idiv(arg5, period)
  if u > 0 and charged >= c then
    local last = c + idiv(u - 1, limit)
    local only_debt_after = ARGV[11] == '0' and reserved_until <= now
    if (charged == last and (u <= limit or cost == 1)) or (charged == c and only_debt_after) then
      u = math.max(u - cost, 0)
    end
  end
  save(kept)
  return refunded()
end

if op == 'c' then
  -- The count of this cycle grows, past the limit if it must: debt the next cycles pay.
  u = u + cost
  save(kept)
  return refunded()
end

local max_wait = arg5
if u + cost <= limit then
  u = u + cost
  save(kept)
  return decision(1, limit - u, 0, reset_after(), 0, now)
end
local wait = until_cycles(cdiv(u + cost - limit, limit))
if wait <= max_wait then
  u = u + cost
  reserved_until = math.max(reserved_until, now + wait)
  save(kept)
  return decision(1, 0, 0, reset_after(), wait, now + wait)
end
if relaid then
  save(kept)
end
return decision(0, math.max(limit - u, 0), wait, reset_after(), 0, 0)
