end
-- tower-bulwark: the end of an algorithm's batch script (see `scripts!` in script.rs). Above, the
-- function `one` runs the algorithm's script (prelude included) on the ARGV and KEYS it is
-- given; here, the call's ARGV (`batch`) holds each call's arguments led by their count, and
-- each is run by `one` in order: on the one key of a batch of decisions, or on the key of its
-- place in KEYS (a renewal of several keys' holds). The reply is the list of their replies.
local on = { keys[1] }
while i <= #batch do
  local n = tonumber(batch[i])
  if #keys > 1 then
    on = { keys[#replies + 1] }
  end
  if not n or n < 1 or i + n > #batch or not on[1] then
    return redis.error_reply('tower-bulwark: malformed batch arguments')
  end
  replies[#replies + 1] = one({unpack(batch, i + 1, i + n)}, on)
  i = i + n + 1
end
return replies
