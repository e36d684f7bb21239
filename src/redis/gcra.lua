-- GCRA on one key holding "<tat>:<latest>": the theoretical arrival time (TAT), and the latest
-- clock reading that admitted or gave back (a key holding "<tat>" alone is read with no latest
-- reading), then ":1" while the TAT lies beyond the horizon and a reservation made since the key
-- was last within its burst (or a lease that starts later) may hold a slot there; beyond the
-- horizon without it lies debt, which a give-back may lower (the in-memory GCRA's `WAITER`
-- bit); then, once a give-back moved the TAT back under a later admission, ":<m>" after the
-- mark ("0" without it), m one more than the latest reading it did so at (the in-memory
-- `LatestReading::moved_back`): an admission decided no later than that is not taken for the
-- key's latest because the TAT came back to the value it left. A reading older than `latest` (a
-- stale client clock, a server clock stepped back) is decided as of `latest`, as the in-memory
-- GCRA does.
-- ARGV[8] emission interval, ARGV[9] horizon (burst * interval), ARGV[10] burst; for a refund,
-- ARGV[11] the TAT the refunded admission left (its decision's eighth item) and ARGV[12] how
-- long it waited (0: admitted at once; ARGV[5], the instant it was charged at, less that is
-- when it was decided).
--
-- Leases (ops 'l' and 'e'): shares of the burst that an instance admits from without asking.
-- The key then holds ";<id>,<permits>,<end>" after "<tat>:<latest>" for each lease out. While a
-- lease is out, its permits count as taken at every instant until it ends or comes back: the
-- key's TAT is at least now + (permits out) * interval, so the permits this key can still hand
-- out and those in leases are never more than the burst together, and the bucket refills only
-- below that. A lease that comes back at `now` with `unused` permits leaves the TAT where its
-- pinning had it at `now`, less the unused ones; one that ends without coming back (its
-- instance died, or was too late) leaves it where its pinning had it at its end.
-- 'l' (arguments in `prelude.lua`): a lease counted as taken from now until its end (Redis
--      keeps it ARGV[5] from its start); or a refusal as a decision's, when no share starts
--      within a lease's length, whose retry_after is when the share wanted can be had.
local key = KEYS[1]
local interval = tonumber(ARGV[8])
local horizon = tonumber(ARGV[9])
local limit = tonumber(ARGV[10])
local tat, latest, waiter, moved = 0, 0, false, 0
-- The leases out, by id: { permits, end }, and their permits.
local leases, out = {}, 0
local raw = redis.call('GET', key)
do
  if raw then
    local t, l, rest = string.match(raw, '^([^:;]*):([^:;]*)(.*)$')
    if t then
      tat, latest = stored(t, 0), stored(l, 0)
      if rest ~= '' and string.byte(rest) == 58 then
        local r
        r, rest = string.match(rest, '^:([^:;]*)(.*)$')
        waiter = stored(r, 0) > 0
        if rest ~= '' and string.byte(rest) == 58 then
          r, rest = string.match(rest, '^:([^:;]*)(.*)$')
          moved = stored(r, 0)
        end
      end
    else
      tat, rest = stored(raw, 0), ''
    end
    if rest ~= '' then
      if string.byte(rest) ~= 59 then
        error('tower-bulwark: the state of ' .. key .. ' is not one this crate wrote')
      end
      leases = read_leases(rest)
    end
  end
end
now = math.max(now, latest)
-- With a client clock, a key that existed is kept when it holds nothing more (`prelude.lua`):
-- given to each `save`, not read in it (an upvalue more in `save` cost a decision 0.5 %).
local kept = ttl_margin > 0 and raw
for _, lease in pairs(leases) do
  out = out + lease[1]
end

-- The TAT and the permits out once the leases that end by `by` have, each counted as taken at
-- its end, in the order they end (dropped from the table if `drop`).
local function ended_by(by, drop)
  local t, o, order = tat, out, {}
  for id, lease in pairs(leases) do
    if lease[2] <= by then
      table.insert(order, id)
    end
  end
  if #order > 1 then
    table.sort(order, function(a, b) return leases[a][2] < leases[b][2] end)
  end
  for _, id in ipairs(order) do
    t = math.max(t, leases[id][2] + o * interval)
    o = o - leases[id][1]
    if drop then
      leases[id] = nil
    end
  end
  return t, o
end

-- Leases that ended by `now` stop counting, each at its end: the TAT is first raised to where
-- their pinning had it then.
tat, out = ended_by(now, true)

-- The TAT with the leases out pinned at `now`.
local function pinned()
  return math.max(tat, now + out * interval)
end

-- The TAT once every lease out has ended without coming back, each counted at its end.
local function frozen()
  return (ended_by(math.huge, false))
end

-- Ends the lease `id`, its `unused` permits back, if it is still out. Under a TAT past the
-- horizon (a reservation still ahead, or debt that other instances' shares were leased
-- beside), nothing comes back: the permits would come before it.
local function end_lease(id, unused)
  local lease = leases[id]
  if not lease then
    return
  end
  if tat - horizon > now then
    unused = 0
  end
  tat = math.max(pinned() - math.min(unused, lease[1]) * interval, now)
  out = out - lease[1]
  leases[id] = nil
end

local function save(t, l, keep)
  local last = t
  for _, lease in pairs(leases) do
    last = math.max(last, lease[2])
  end
  if last > now or keep then
    -- The mark of a waiter's slot lasts while the TAT lies beyond the horizon.
    local marked = waiter and t - horizon > now
    if moved > 0 then
      local mark = marked and ':1:' or ':0:'
      redis.call('SET', key, int(t) .. ':' .. int(l) .. mark .. int(moved) .. write_leases(leases), 'PX', expiry_ms(last - now))
    elseif marked then
      redis.call('SET', key, int(t) .. ':' .. int(l) .. ':1' .. write_leases(leases), 'PX', expiry_ms(last - now))
    else
      redis.call('SET', key, int(t) .. ':' .. int(l) .. write_leases(leases), 'PX', expiry_ms(last - now))
    end
  else
    -- A TAT in the past carries no information (but its latest reading, which a give-back
    -- keeps where it must).
    redis.call('DEL', key)
  end
end

if op == 'e' then
  end_lease(lease_back, lease_unused)
  save(tat, now, kept)
  return refunded()
end

if op == 'l' then
  -- The lease this call ends, if it names one (id 0: none).
  end_lease(lease_back, lease_unused)
  local length, wanted = arg5, lease_wanted
  local base = pinned()
  local available = idiv(math.max(now + horizon - base, 0), interval)
  -- What can be had now, up to the share wanted, if that is at least the cost of the call
  -- asking and half the share; otherwise the whole share, from when it can be had: a lease
  -- that starts later (the instance refuses until then, and asks nothing more of Redis), as
  -- long as that is within the length of a lease (ARGV[5] is twice that): no sooner would the
  -- instance's demand be known to outlast the wait. While the instances together want more
  -- than the quota, what accrues between two calls is a sliver, so each lease is a whole share
  -- taken in one call: the calls a second follow the shares, not the rate.
  local permits, start = math.min(wanted, available), now
  if available < cost or available * 2 < wanted then
    permits, start = wanted, base + interval * wanted - horizon
  end
  -- Never more permits in leases than the burst: a lease's permits may all be admitted at
  -- any instant of its time, and those of leases that start later too.
  if start - now > length / 2 or out + permits > limit or not lease_room(leases) then
    -- Nothing leased: when the share could be had. A full table of leases, or an id already
    -- out, is refused the same way.
    local wait = math.max(base + interval * wanted - horizon - now, 1)
    if lease_back > 0 then
      save(tat, now, kept)
    end
    return decision(0, available, wait, base - now, 0, 0, 0)
  end
  tat = base + permits * interval
  -- A share that starts later holds slots beyond the horizon, as a waiter's reservation does.
  waiter = waiter or start > now
  out = out + permits
  leases[lease_id] = { permits, start + length }
  save(tat, now, kept)
  return { 4, permits, start, start + length, math.max(available - permits, 0), server_time }
end

if op == 'r' then
  -- As the in-memory GCRA gives back (see `Gcra::refund`): `cost` intervals while the refunded
  -- admission is still the key's latest (the key's TAT is the one it left, ARGV[11], and no
  -- give-back moved it back since the admission was decided); when later admissions or debt
  -- moved the TAT on, this one was immediate and no waiter can hold a slot ahead (none past the
  -- horizon, or the key is not marked), `cost` intervals less the time elapsed since this one
  -- was charged (ARGV[5]); otherwise nothing. Never below the latest reading.
  local left = count_arg(ARGV[11])
  local waited = count_arg(ARGV[12])
  if not left or not waited or waited > arg5 then
    return redis.error_reply('tower-bulwark: malformed script arguments')
  end
  if tat > now and left > 0 then
    local give = interval * cost
    local back = 0
    if tat == left and moved <= arg5 - waited then
      back = give
    elseif waited == 0 and (tat - horizon <= now or not waiter) then
      back = math.max(give - math.max(now - arg5, 0), 0)
      if back > 0 then
        moved = math.max(moved, now + 1)
      end
    end
    if back > 0 then
      tat = math.max(tat - back, now)
    end
  end
  -- A give-back that gives nothing back still records its reading, as in memory (a key that
  -- does not exist, with no TAT, stays so); with a client clock, a key it leaves holding
  -- nothing keeps that reading (see `prelude.lua`'s `ttl_margin`).
  if raw then
    save(tat, now, kept)
  end
  return refunded()
end

if op == 'c' then
  -- The TAT moves on by the charge, past the burst if it must (as `Gcra::charge`), and no
  -- further than the arithmetic stays exact (2^53 - 1).
  save(math.min(pinned() + interval * cost, 9007199254740991), now, kept)
  return refunded()
end

local max_wait = arg5
local base = pinned()
local new_tat = base + interval * cost
local allow_at = math.max(new_tat - horizon, 0)
if allow_at <= now then
  save(new_tat, now, kept)
  return decision(1, idiv(now + horizon - new_tat, interval), 0, new_tat - now, 0, now, new_tat)
end
if out > 0 then
  -- A reservation falls due after every lease out has ended: their permits may be spent until
  -- then, which pinning them at now does not count.
  base = math.max(base, frozen())
  new_tat = base + interval * cost
  allow_at = math.max(new_tat - horizon, 0)
end
local wait = allow_at - now
if wait <= max_wait then
  waiter = true
  save(new_tat, now, kept)
  return decision(1, 0, 0, new_tat - now, wait, allow_at, new_tat)
end
local remaining = idiv(math.max(now + horizon - base, 0), interval)
return decision(0, remaining, wait, base - now, 0, 0, 0)
