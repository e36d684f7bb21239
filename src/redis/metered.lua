-- Metered on one key (the in-memory `Metered`: GCRA whose settles are exact), the key holding
-- "<tat>:<latest>" then ";<id>,<permits>,<at>,<expires>" for each hold: the TAT of what has
-- been settled, the latest clock reading that admitted or settled, and the admissions not
-- settled yet, each by the id its client gave it, with its estimate in permits, the instant it
-- was charged at (its decision's instant, or the instant a reservation falls due) and the
-- instant it expires. A reading older than `latest` is decided as of `latest`.
--
-- A request is admitted as GCRA admits it on the TAT `max(tat, now) + held * interval` (held:
-- the permits of every hold); an admission adds its hold. A settle ('s') takes the hold's
-- estimate back out and charges the settled cost, up to the estimate, as of the instant the
-- hold was charged at; a cost beyond the estimate (up to the burst) is debt, charged from now.
-- A settle naming a hold that is no longer here (settled already, or expired) charges only
-- that debt. A hold not settled by its expiry (an instance that died, or whose renewals did not
-- reach Redis) is charged its whole estimate as of its admission, then dropped: the estimate
-- stands. At most 256 holds are kept per key: a decision that finds them all taken (or its id
-- already among them) is refused, its retry_after at least a second.
--
-- A renewal ('k') moves the expiry of each hold it names to `hold_for` from now, never earlier.
--
-- ARGV[8] emission interval, ARGV[9] horizon (burst * interval), ARGV[10] burst, ARGV[11] how
-- long a hold lasts (ticks); then for a decision ARGV[12] the id of its hold. A settle ('s')
-- has ARGV[4] the cost it settles to, ARGV[5] the estimate its admission held, ARGV[12] the id.
-- A renewal has its holds from ARGV[12] (see holds.lua).
local key = KEYS[1]
local interval = tonumber(ARGV[8])
local horizon = tonumber(ARGV[9])
local limit = tonumber(ARGV[10])
local hold_for = tonumber(ARGV[11])
local hold_id = ARGV[12] and count_arg(ARGV[12])
local renewals = op == 'k' and renewed(12)
if not renewals and ((op ~= 'd' and op ~= 's') or not hold_id or hold_id == 0) then
  return redis.error_reply('tower-bulwark: malformed script arguments')
end
-- The largest TAT the arithmetic keeps exact.
local max_tat = 9007199254740991
local tat, latest = 0, 0
-- The holds, by id: { permits, at, expires }.
local holds = {}
local raw = redis.call('GET', key)
do
  if raw then
    local t, l, rest = string.match(raw, '^([^:;]*):([^:;]*)(.*)$')
    if not t then
      error('tower-bulwark: the state of ' .. key .. ' is not "<tat>:<latest>" then its holds')
    end
    tat, latest = stored(t, 0), stored(l, 0)
    local parsed = 0
    for id, permits, at, expires in string.gmatch(rest, ';([^,;]*),([^,;]*),([^,;]*),([^,;]*)') do
      holds[stored(id, 0)] = { stored(permits, 0), stored(at, 0), stored(expires, 0) }
      parsed = parsed + 4 + #id + #permits + #at + #expires
    end
    if parsed ~= #rest then
      error('tower-bulwark: the holds in ' .. key .. ' are not ";<id>,<permits>,<at>,<expires>" each')
    end
  end
end
now = math.max(now, latest)
-- With a client clock, a key that existed is kept when it holds nothing more (`prelude.lua`):
-- given to each `save`, not read in it.
local kept = ttl_margin > 0 and raw

-- The TAT after `permits` charged at `at`.
local function charged(at, permits)
  return math.min(math.max(tat, at) + permits * interval, max_tat)
end

-- Holds that expired by now stand: each is charged its estimate as of its admission, in the
-- order they were charged at (then by id), and dropped.
local changed = false
do
  local expired = {}
  for id, hold in pairs(holds) do
    if hold[3] <= now then
      expired[#expired + 1] = id
    end
  end
  table.sort(expired, function(a, b)
    if holds[a][2] ~= holds[b][2] then
      return holds[a][2] < holds[b][2]
    end
    return a < b
  end)
  for _, id in ipairs(expired) do
    tat = charged(holds[id][2], holds[id][1])
    holds[id] = nil
    changed = true
  end
end

-- The holds left: how many, their permits, the latest instant one was charged at and the
-- latest expiry.
local count, held, last_at, last_expiry = 0, 0, 0, 0
for _, hold in pairs(holds) do
  count = count + 1
  held = held + hold[1]
  last_at = math.max(last_at, hold[2])
  last_expiry = math.max(last_expiry, hold[3])
end

-- Writes the state, kept until it carries no information: past the settled TAT, every hold's
-- expiry, and the TAT that charging every hold at its instant would leave.
local function save(keep)
  local parts = { int(tat) .. ':' .. int(now) }
  local last = tat
  if count > 0 then
    last = math.max(last, last_expiry, math.max(tat, last_at) + held * interval)
  end
  for id, hold in pairs(holds) do
    parts[#parts + 1] = ';' .. int(id) .. ',' .. int(hold[1]) .. ',' .. int(hold[2]) .. ',' .. int(hold[3])
  end
  if last > now or keep then
    redis.call('SET', key, table.concat(parts), 'PX', expiry_ms(last - now))
  else
    redis.call('DEL', key)
  end
end

if renewals then
  for _, renewal in ipairs(renewals) do
    local hold = holds[renewal[1]]
    if hold then
      hold[3] = math.max(hold[3], now + hold_for)
      last_expiry = math.max(last_expiry, hold[3])
    end
  end
  save(kept)
  return refunded()
end

if op == 's' then
  local estimate = arg5
  local hold = holds[hold_id]
  if hold then
    local released = math.min(estimate, hold[1])
    local used = math.min(cost, released)
    if used > 0 then
      tat = charged(hold[2], used)
    end
    hold[1] = hold[1] - released
    held = held - released
    if hold[1] == 0 then
      holds[hold_id] = nil
      count = count - 1
    end
  end
  local debt = math.min(cost, limit) - estimate
  if debt > 0 then
    tat = charged(now, debt)
  end
  save(kept)
  return refunded()
end

local max_wait = arg5
local base = math.min(math.max(tat, now) + held * interval, max_tat)
local new_tat = base + interval * cost
local allow_at = math.max(new_tat - horizon, 0)
local wait = allow_at - now
if count >= 256 or holds[hold_id] then
  -- No room for another hold: refused until one settles, a second at least.
  if changed then
    save(kept)
  end
  return decision(0, 0, math.max(wait, 1000 * ticks_per_ms), base - now, 0, 0)
end
if wait <= max_wait then
  local at = math.max(allow_at, now)
  holds[hold_id] = { cost, at, at + hold_for }
  count, held = count + 1, held + cost
  last_at, last_expiry = math.max(last_at, at), math.max(last_expiry, at + hold_for)
  save(kept)
  if allow_at <= now then
    return decision(1, idiv(now + horizon - new_tat, interval), 0, new_tat - now, 0, now)
  end
  return decision(1, 0, 0, new_tat - now, wait, allow_at)
end
if changed then
  save(kept)
end
return decision(0, idiv(math.max(now + horizon - base, 0), interval), wait, base - now, 0, 0)
