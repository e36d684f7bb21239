-- GCRA on one key holding "<tat>:<latest>": the theoretical arrival time (TAT), and the latest
-- clock reading that admitted or gave back (a key holding "<tat>" alone is read with no latest
-- reading). A reading older than `latest` (a stale client clock, a server clock stepped back) is
-- decided as of `latest`, as the in-memory GCRA does.
-- ARGV[8] emission interval, ARGV[9] horizon (burst * interval), ARGV[10] burst; for a refund,
-- ARGV[11] the TAT the refunded admission left (its decision's eighth item) and ARGV[12] '1' if
-- it was a reservation (it waited), '0' if it was admitted at once.
local key = KEYS[1]
local interval = tonumber(ARGV[8])
local horizon = tonumber(ARGV[9])
local limit = tonumber(ARGV[10])
local tat, latest = 0, 0
do
  local raw = redis.call('GET', key)
  if raw then
    local t, l = string.match(raw, '^([^:]*):([^:]*)$')
    if t then
      tat, latest = stored(t, 0), stored(l, 0)
    else
      tat = stored(raw, 0)
    end
  end
end
now = math.max(now, latest)

local function save(t, l)
  if t > now then
    redis.call('SET', key, int(t) .. ':' .. int(l))
    expire_in(key, t - now)
  else
    -- A TAT in the past carries no information.
    redis.call('DEL', key)
  end
end

if op == 'r' then
  -- As the in-memory GCRA gives back (see `Gcra::refund`): `cost` intervals while the refunded
  -- admission is still the key's latest (the key's TAT is the one it left, ARGV[11]); when later
  -- admissions moved the TAT on but none of them, nor this one, is a reservation still ahead,
  -- `cost` intervals less the time elapsed since this one was charged (ARGV[5]); otherwise
  -- nothing. Never below the latest reading.
  local left = count_arg(ARGV[11])
  local reserved = ARGV[12]
  if not left or (reserved ~= '0' and reserved ~= '1') then
    return redis.error_reply('tower-bulwark: malformed script arguments')
  end
  if tat > now and left > 0 then
    local give = interval * cost
    local back = 0
    if tat == left then
      back = give
    elseif reserved == '0' and tat - horizon <= now then
      back = math.max(give - math.max(now - arg5, 0), 0)
    end
    if back > 0 then
      tat = math.max(tat - back, now)
    end
    save(tat, now)
  end
  return refunded()
end

if op == 'c' then
  -- The TAT moves on by the charge, past the burst if it must (as `Gcra::charge`), and no
  -- further than the arithmetic stays exact (2^53 - 1).
  save(math.min(math.max(tat, now) + interval * cost, 9007199254740991), now)
  return refunded()
end

local max_wait = arg5
local base = math.max(tat, now)
local new_tat = base + interval * cost
local allow_at = math.max(new_tat - horizon, 0)
if allow_at <= now then
  save(new_tat, now)
  return decision(1, idiv(now + horizon - new_tat, interval), 0, new_tat - now, 0, now, new_tat)
end
local wait = allow_at - now
if wait <= max_wait then
  save(new_tat, now)
  return decision(1, 0, 0, new_tat - now, wait, allow_at, new_tat)
end
local remaining = idiv(math.max(now + horizon - base, 0), interval)
return decision(0, remaining, wait, base - now, 0, 0, 0)
