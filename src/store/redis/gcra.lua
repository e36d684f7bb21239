-- GCRA on one key holding the theoretical arrival time (TAT).
-- ARGV[8] emission interval, ARGV[9] horizon (burst * interval), ARGV[10] burst
local key = KEYS[1]
local interval = tonumber(ARGV[8])
local horizon = tonumber(ARGV[9])
local limit = tonumber(ARGV[10])
local tat = stored(redis.call('GET', key), 0)

local function save(t)
  if t > now then
    redis.call('SET', key, int(t))
    expire_in(key, t - now)
  else
    -- A TAT in the past carries no information.
    redis.call('DEL', key)
  end
end

if op == 'r' then
  -- Only time still ahead of now can be given back; the past is spent.
  if tat > now then
    local t = tat - interval * cost
    if t < now then
      t = now
    end
    save(t)
  end
  return refunded()
end

local max_wait = arg5
local base = math.max(tat, now)
local new_tat = base + interval * cost
local allow_at = math.max(new_tat - horizon, 0)
if allow_at <= now then
  save(new_tat)
  return decision(1, idiv(now + horizon - new_tat, interval), 0, new_tat - now, 0, now)
end
local wait = allow_at - now
if wait <= max_wait then
  save(new_tat)
  return decision(1, 0, 0, new_tat - now, wait, allow_at)
end
local remaining = idiv(math.max(now + horizon - base, 0), interval)
return decision(0, remaining, wait, base - now, 0, 0)
