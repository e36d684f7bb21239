-- tower-bulwark: what the scripts of the algorithms that hold (`metered.lua`, `concurrency.lua`)
-- share, after prelude.lua. Each admission holds its permits or slots under an id its instance
-- gave it, until it is given back or settled, or until it expires: the last of the algorithm's
-- own arguments is how long a hold lasts unless renewed, in ticks. The instance renews the
-- holds it still has ('k', see src/redis/hold.rs), each key's in one call of the batch script:
-- after the algorithm's arguments and the hold's id argument's place, pairs of a hold's id and
-- the units (permits, slots) it still holds.

-- The holds a renewal names, from ARGV[first] on, { id, units } each; nil if malformed.
local function renewed(first)
  local list = {}
  for i = first, #ARGV, 2 do
    local id, units = count_arg(ARGV[i]), count_arg(ARGV[i + 1])
    if not id or id == 0 or not units then
      return nil
    end
    list[#list + 1] = { id, units }
  end
  return list
end
