end
-- tower-bulwark: the end of an algorithm's batch script (see `scripts!` in script.rs). Above, the
-- function `one` runs the algorithm's script (prelude included) on the ARGV it is given; here,
-- the call's ARGV (`batch`) holds each decision's arguments led by their count, and each is run
-- by `one` in order. The reply is the list of their replies.
while i <= #batch do
  local n = tonumber(batch[i])
  if not n or n < 1 or i + n > #batch then
    return redis.error_reply('tower-bulwark: malformed batch arguments')
  end
  replies[#replies + 1] = one({unpack(batch, i + 1, i + n)})
  i = i + n + 1
end
return replies
