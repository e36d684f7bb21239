-- tower-bulwark: shared prelude of every limiter script.
--
-- Every time and duration is an integer number of ticks: microseconds when the time comes from
-- the server's TIME, nanoseconds when the client passes its own clock (tests). Lua 5.1 numbers
-- are doubles, exact for integers below 2^53; the client checks that every value it sends keeps
-- the arithmetic below that bound, and the helpers below round exactly like the Rust code.
--
-- ARGV[1] operation: 'd' decide, 'r' refund
-- ARGV[2] now in ticks, or '' to read the server's TIME (in microseconds)
-- ARGV[3] ticks per millisecond (for key expiries)
-- ARGV[4] cost in permits
-- ARGV[5] decide: longest wait a caller accepts; refund: instant the reservation fell due
-- ARGV[6] milliseconds added to every expiry: 0 with the server's TIME; with a client clock,
--         whose pace need not match the server's, a margin so no state expires while it matters
-- ARGV[7..] the algorithm's own parameters

local op = ARGV[1]
local now
if ARGV[2] == '' then
  if redis.replicate_commands then
    -- Redis 3.2 and 4 need effects replication to write after reading TIME; later it is a no-op.
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
local ticks_per_ms = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local arg5 = tonumber(ARGV[5])
local ttl_margin = tonumber(ARGV[6])

-- floor(a / b) for integers 0 <= a, 0 < b below 2^53, exact despite floating point division.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b), same domain.
local function cdiv(a, b)
  return idiv(a + b - 1, b)
end

-- An integer as a decimal string (tostring would switch to exponents above 1e14).
local function int(x)
  return string.format('%.0f', x)
end

-- Keeps `key` for `ticks` more ticks, rounded up to whole milliseconds, at least one, plus the
-- margin.
local function expire_in(key, ticks)
  local ms = cdiv(ticks, ticks_per_ms)
  if ms < 1 then
    ms = 1
  end
  ms = ms + ttl_margin
  redis.call('PEXPIRE', key, int(ms))
end

-- A number read back from stored state; anything else is corrupt state and fails the script.
local function stored(value, default)
  if not value then
    return default
  end
  local n = tonumber(value)
  if not n then
    error('tower-bulwark: the state of ' .. KEYS[1] .. ' is not a number')
  end
  return n
end

-- The decision as the client parses it: six integers.
local function decision(allowed, remaining, retry_after, reset_after, wait, reserved_at)
  return { allowed, remaining, retry_after, reset_after, wait, reserved_at }
end

if not now or not ticks_per_ms or not cost or not arg5 or not ttl_margin then
  return redis.error_reply('tower-bulwark: malformed script arguments')
end
