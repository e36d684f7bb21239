-- Sliding-window counter on one hash: w = index of the current window (from tick zero),
-- p, c, n = permits of the previous, current and next window, l = the latest clock reading (an
-- older reading is decided as of it, so it never lands in a window that has rolled away), d = the
-- window length `w` counts in (absent: the current length), g = the numbering the windows
-- hold: the reading the key was written first at, raised past it at every renumbering by a
-- change of length (absent: 0), so that neither a renumbering nor a key deleted and written
-- anew gives a numbering an earlier decision was counted under, r = the permits of `c` reserved
-- (so perhaps not yet due): what reservations of it and of `n` came to, less what came back
-- (absent: 0), u = the instant before which reservations laid out anew at a change of length
-- may fall due (absent: 0).
-- ARGV[8] window, ARGV[9] limit; for a give-back, ARGV[10] one more than the numbering its
-- admission was counted under (its decision's `state_after`; 0: unknown, taken as the current)
-- and ARGV[11] how long it waited ('0': admitted at once)
--
-- Leases (ops 'l' and 'e', arguments in `prelude.lua`): a share of the permits the
-- current window can still admit, counted in `c` at once and admitted from only until the
-- window ends. A permit spent from it later in the window weighs no less than an admission
-- then (the previous window's share only shrinks), so every use keeps to the counter's
-- estimate. x = the leases of the current and previous windows, each with the window that
-- counted it, so that one coming back gives its unused permits back there.
local key = KEYS[1]
local window = tonumber(ARGV[8])
local limit = tonumber(ARGV[9])
local state = redis.call('HMGET', key, 'w', 'p', 'c', 'n', 'l', 'd', 'x', 'g', 'r')
local w = stored(state[1], 0)
local prev = stored(state[2], 0)
local curr = stored(state[3], 0)
local nxt = stored(state[4], 0)
local latest = stored(state[5], 0)
local g = stored(state[8], 0)
local reserved = stored(state[9], 0)
now = math.max(now, latest)
-- With a client clock, a key that existed is kept when it holds nothing more (`prelude.lua`):
-- given to each `save`, not read in it.
local kept = ttl_margin > 0 and state[1]
if not state[1] then
  g = now
end
local leases = read_leases(state[7])
-- The quota's period changed since the key was written: its counters move, as they are, to the
-- window of this length that holds its latest reading, and roll on from there. The leases' marks
-- move with them; a decision's instant, which the client holds, cannot, so a give-back tells
-- which numbering counted it (g).
if stored(state[6], window) ~= window then
  local renumbered = idiv(latest, window)
  for id, lease in pairs(leases) do
    local mark = lease[2] + renumbered - w
    if mark < 0 then
      leases[id] = nil
    else
      lease[2] = mark
    end
  end
  w, g = renumbered, math.max(g + 1, latest)
  -- Reservations standing ahead fall due in windows of the old length, which these need not
  -- line up with: until the end of the window the last of them may fall due in (one old
  -- window after the latest reading for a reservation of the current window, two for one of
  -- the next; no earlier than a hold before, u), the key admits nothing more (that window
  -- counts as full, or as its fullest count; no count is lowered, and no lease gives anything
  -- back into it). As in memory. (`u` is read and written only here, at a change of length.)
  local old_windows_ahead = 0
  if nxt > 0 then
    old_windows_ahead = 2
  elseif reserved > 0 then
    old_windows_ahead = 1
  end
  local due_before = latest + old_windows_ahead * stored(state[6], window)
  due_before = math.max(due_before, stored(redis.call('HGET', key, 'u'), 0))
  if due_before > latest then
    redis.call('HSET', key, 'u', int(due_before))
    local last_due = math.max(idiv(due_before - 1, window), w)
    if last_due ~= w then
      nxt = 0
    end
    w, curr, leases = last_due, math.max(curr, nxt, limit), {}
  end
end

-- Roll the counters forward to the window holding now.
local idx = idiv(now, window)
local gap = math.max(idx - w, 0)
if gap == 1 then
  prev, curr, reserved, nxt = curr, nxt, nxt, 0
elseif gap == 2 then
  prev, curr, reserved, nxt = nxt, 0, 0, 0
elseif gap > 2 then
  prev, curr, reserved, nxt = 0, 0, 0, 0
end
w = math.max(w, idx)
-- Leases of windows before the previous one count nowhere any more.
for id, lease in pairs(leases) do
  if lease[2] + 1 < w then
    leases[id] = nil
  end
end

local start = w * window
-- Negative only while reservations laid out anew after a change of length hold the key in a
-- window ahead.
local e = now - start

-- The earliest offset into a window with counts (p, c) at which `cost` fits, or nil: the least
-- `at` with floor(p * (window - at) / window) <= room, that is
-- p * (window - at) <= (room + 1) * window - 1.
local function earliest(p, c)
  local room = limit - (c + cost)
  if room < 0 then
    return nil
  end
  if p == 0 then
    return 0
  end
  local at = math.max(window - idiv((room + 1) * window - 1, p), 0)
  if at < window then
    return at
  end
  return nil
end

-- The previous window's share at offset `at`, rounded down (so that a limit of 1 admits steady
-- traffic below the rate).
local function carried(p, at)
  return idiv(p * (window - at), window)
end

local function reset_after()
  local left
  if nxt > 0 then
    left = 3
  elseif curr > 0 then
    left = 2
  elseif prev > 0 then
    left = 1
  else
    return 0
  end
  return (w + left) * window - now
end

local function remaining()
  return math.max(limit - (curr + carried(prev, math.max(e, 0))), 0)
end

local function save(keep)
  if prev == 0 and curr == 0 and nxt == 0 and not keep then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'w', int(w), 'p', int(prev), 'c', int(curr), 'n', int(nxt), 'l', int(now), 'd', int(window), 'x', write_leases(leases), 'g', int(g))
    -- Written only while it holds something: as a field of every call, it cost 5 % more
    -- instructions a decision.
    if reserved > 0 then
      redis.call('HSET', key, 'r', int(reserved))
    elseif state[9] then
      redis.call('HDEL', key, 'r')
    end
    expire_in(key, reset_after())
  end
end

if op == 'r' then
  -- Whichever window the admission was charged to, if it still counts: past or future. Its
  -- instant names that window only in the numbering it was counted under: after a renumbering
  -- nothing comes back (never more than was taken; a change of period is rare).
  local counted_under = count_arg(ARGV[10]) or 0
  if counted_under == 0 or counted_under == g + 1 then
    local at_idx = idiv(arg5, window)
    if at_idx + 1 == w then
      prev = math.max(prev - cost, 0)
    elseif at_idx == w then
      curr = math.max(curr - cost, 0)
      if ARGV[11] ~= '0' then
        reserved = math.max(reserved - cost, 0)
      end
    elseif at_idx == w + 1 then
      nxt = math.max(nxt - cost, 0)
    end
  end
  save(kept)
  return refunded()
end

if op == 'c' then
  -- The count of the window of now grows, past the limit if it must.
  curr = curr + cost
  save(kept)
  return refunded()
end

-- Ends the lease `id`, its `unused` permits back in the window that counted it.
local function end_lease(id, unused)
  local lease = leases[id]
  if not lease then
    return
  end
  leases[id] = nil
  local back = math.min(unused, lease[1])
  if lease[2] == w then
    curr = math.max(curr - back, 0)
  elseif lease[2] + 1 == w then
    prev = math.max(prev - back, 0)
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
  local available = remaining()
  if available < cost or not lease_room(leases) then
    -- Nothing leased: when `cost` permits fit, as a decision says.
    if lease_back > 0 then
      save(kept)
    end
    local here = earliest(prev, curr)
    local wait
    if here and here > e then
      wait = here - e
    else
      wait = window - e + (earliest(curr, nxt) or window)
    end
    return decision(0, available, math.max(wait, 1), reset_after(), 0, 0, 0)
  end
  local permits = math.min(wanted, available)
  curr = curr + permits
  leases[lease_id] = { permits, w }
  save(kept)
  local ends = math.min(now + length, start + window)
  return { 4, permits, now, ends, remaining(), server_time }
end

local max_wait = arg5
local here = earliest(prev, curr)
if here and here <= e then
  curr = curr + cost
  save(kept)
  return decision(1, remaining(), 0, reset_after(), 0, now, g + 1)
end
local admit_at, which
if here then
  admit_at, which = start + here, 0
else
  local there = earliest(curr, nxt)
  if there then
    admit_at, which = start + window + there, 1
  else
    admit_at, which = start + 2 * window + (earliest(nxt, 0) or 0), 2
  end
end
local wait = admit_at - now
if wait <= max_wait and which < 2 then
  if which == 0 then
    curr = curr + cost
    reserved = reserved + cost
  else
    nxt = nxt + cost
  end
  save(kept)
  return decision(1, 0, 0, reset_after(), wait, admit_at, g + 1)
end
return decision(0, remaining(), wait, reset_after(), 0, 0, 0)
