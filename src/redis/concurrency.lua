-- Concurrency on one key (the in-memory `Concurrency`, for `Policy::concurrent_in_redis`): at
-- most `limit` slots held at once. Each slot is a member '<hold>:<n>' of the key's sorted set
-- (n from 1 to the slots its admission took), scored by the instant it expires unless its
-- instance renews it; a slot whose expiry has passed counts no more, so the slots of an
-- instance that died come back. A give-back ('s') removes the last slots its hold still has,
-- by their names, so one that arrives late or twice frees no other request's slot. A refusal
-- says to wait a second (when a slot frees is not known). A key of another type fails the
-- script with Redis's WRONGTYPE error.
--
-- ARGV[8] the most slots the key holds, ARGV[9] how long a slot lasts unless renewed (ticks);
-- then for a decision ARGV[10] the id of its hold. A give-back has ARGV[4] the slots the hold
-- had (in the place of a cost: a slot has none), ARGV[5] those it gives back and ARGV[10] the
-- hold's id; a renewal has its holds from ARGV[10] (see holds.lua).
local key = KEYS[1]
local limit, hold_for = count_arg(ARGV[8]), count_arg(ARGV[9])
local hold_id = count_arg(ARGV[10])
if not limit or not hold_for then
  return redis.error_reply('tower-bulwark: malformed script arguments')
end
local expires = int(now + hold_for)

-- Keeps the key at least until its latest slot expires (never shorter: a clock read later may
-- be behind one read earlier).
local function keep()
  local ms = expiry_ms(hold_for)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Runs `command` on the key with `args`, at most a thousand at a time (unpack's limits).
local function chunked(command, args)
  for i = 1, #args, 1000 do
    redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
  end
end

if op == 'k' then
  local renewals = renewed(10)
  if not renewals then
    return redis.error_reply('tower-bulwark: malformed script arguments')
  end
  -- Only slots still there are renewed: one given back, or expired and pruned, stays gone.
  local found = false
  for _, renewal in ipairs(renewals) do
    for n = 1, renewal[2] do
      local member = int(renewal[1]) .. ':' .. n
      if redis.call('ZSCORE', key, member) then
        redis.call('ZADD', key, expires, member)
        found = true
      end
    end
  end
  if found then
    keep()
  end
  return refunded()
end

if not hold_id or hold_id == 0 then
  return redis.error_reply('tower-bulwark: malformed script arguments')
end
local name = int(hold_id) .. ':'

if op == 's' then
  if arg5 > cost then
    return redis.error_reply('tower-bulwark: malformed script arguments')
  end
  local members = {}
  for n = cost - arg5 + 1, cost do
    members[#members + 1] = name .. n
  end
  chunked('ZREM', members)
  return refunded()
end

if op ~= 'd' then
  return redis.error_reply('tower-bulwark: malformed script arguments')
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
local held = redis.call('ZCARD', key)
if held + cost > limit then
  local second = 1000 * ticks_per_ms
  return decision(0, math.max(limit - held, 0), second, second, 0, 0)
end
local args = {}
for n = 1, cost do
  args[#args + 1] = expires
  args[#args + 1] = name .. n
end
chunked('ZADD', args)
keep()
return decision(1, limit - held - cost, 0, 0, 0, now)
