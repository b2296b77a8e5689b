"""The Lua script of one fleet sync (``fastbreaker.contrib.redis``), run by Redis itself."""

SCRIPT = r"""
-- fastbreaker.contrib.redis: one call of this script is one sync of one slot group.
-- KEYS[g] is a group's prefix (a hash tag: every key the script derives from it is in its slot).
-- ARGV: instance, node, window_ms, min_instances, buckets, budgets, verdict_ms, ahead_ms,
--   then per group: since, n, failure_rate, min_calls, half_open_max, success_threshold,
--   open_ms, lease_ms, max_open_ms, then n entries of key, successes, failures, want (leases
--   wanted), flags (1: the instance's own breaker is tripped, 2: reset the key fleet-wide).
-- then per budget (the last KEYS): the local change in token units, capacity in units.
-- Reply per group: {version, {key, state, gen, remaining_ms, leases, ...}, {malformed...}, epoch}
-- (the epoch names the group's data: a new one when the server lost it);
-- then per budget: this instance's share of the fleet's pool in units (-1: malformed pool).
-- State record (hash <p>:st, field key): "state gen until probe_ok"; CLOSED keys have none.
-- Generations: max(gen + 1, now_ms), so they keep growing if the server loses its data.
-- Nothing read from Redis is trusted: a malformed record, key or field (or one of the wrong
-- type) makes its object (a key, a group, a budget) malformed, reported and skipped; a
-- generation more than ahead_ms past the server's clock is malformed; an open period is cut to
-- max_open_ms.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local inst = ARGV[1]
local node = ARGV[2]
local window = tonumber(ARGV[3])
local min_inst = tonumber(ARGV[4])
local nb = tonumber(ARGV[5])
local nbudgets = tonumber(ARGV[6])
local verdict_ms = tonumber(ARGV[7])
local ahead = tonumber(ARGV[8])
local ngroups = #KEYS - nbudgets
local width = math.max(1, math.floor(window / nb))
local cur = math.floor(now / width)
local a = 9
local out = {}

local function int(v)
  if type(v) ~= 'string' or #v > 18 or not string.match(v, '^%-?%d+$') then
    return nil
  end
  return tonumber(v)
end

local function typed(k, want)
  local kind = redis.call('TYPE', k)['ok']
  return kind == 'none' or kind == want
end

for g = 1, ngroups do
  local p = KEYS[g]
  local since = tonumber(ARGV[a])
  local n = tonumber(ARGV[a + 1])
  local rate = tonumber(ARGV[a + 2])
  local min_calls = tonumber(ARGV[a + 3])
  local hmax = tonumber(ARGV[a + 4])
  local sth = tonumber(ARGV[a + 5])
  local open_ms = tonumber(ARGV[a + 6])
  local lease_ms = tonumber(ARGV[a + 7])
  local max_open = tonumber(ARGV[a + 8])
  local first = a + 9
  a = first + 5 * n
  local stkey = p .. ':st'
  local idx = p .. ':o'
  local version = nil
  local epoch = false
  if typed(p .. ':e', 'string') then
    epoch = redis.call('GET', p .. ':e')
    if not epoch then
      epoch = tostring(now)
      redis.call('SET', p .. ':e', epoch)
    end
  end
  if epoch and typed(p .. ':v', 'string') then
    local vraw = redis.call('GET', p .. ':v')
    version = 0
    if vraw then
      version = int(vraw)
    end
  end
  if version == nil or version < 0 or not typed(stkey, 'hash') or not typed(idx, 'zset') then
    -- the group's own keys are malformed: this group is skipped, the others go on
    out[#out + 1] = { since, {}, { '' }, '' }
  else
  if since > version then
    since = 0 -- the server lost its data: everything is news
  end
  local res = {}
  local bad = {}
  local seen = {}

  -- the record of a key: {state, gen, until, probe_ok}, false when malformed
  local function load(key)
    local raw = redis.call('HGET', stkey, key)
    if not raw then
      return { 0, now, 0, 0 }
    end
    local s = {}
    for x in string.gmatch(raw, '%S+') do
      local v = int(x)
      if v == nil or #s >= 4 then
        return false
      end
      s[#s + 1] = v
    end
    if #s ~= 4 or s[1] < 0 or s[1] > 2 or s[2] < 0 or s[2] > now + ahead or s[3] < 0
        or s[4] < 0 then
      return false
    end
    if s[1] ~= 0 and s[3] > now + max_open then
      s[3] = now + max_open -- no longer than the breaker's own longest open period
    end
    return s
  end

  -- the keys of one entry hold the types this script writes, and its buckets parse
  local function sound(key)
    if not (typed(p .. ':b:' .. key, 'hash') and typed(p .. ':f:' .. key, 'zset')
        and typed(p .. ':t:' .. key, 'zset') and typed(p .. ':a:' .. key, 'zset')
        and typed(p .. ':l:' .. key, 'zset')) then
      return false
    end
    local all = redis.call('HGETALL', p .. ':b:' .. key)
    for i = 1, #all, 2 do
      if not string.match(all[i], '^[sf]%d+$') or int(all[i + 1]) == nil then
        return false
      end
    end
    return true
  end

  local function wipe(key)
    redis.call('HDEL', stkey, key)
    redis.call('ZREM', idx, key)
    redis.call('DEL', p .. ':b:' .. key, p .. ':f:' .. key, p .. ':l:' .. key,
      p .. ':t:' .. key, p .. ':a:' .. key)
  end

  local function save(key, s)
    version = version + 1
    if s[1] == 0 then
      wipe(key)
    else
      redis.call('HSET', stkey, key, string.format('%d %d %d %d', s[1], s[2], s[3], s[4]))
      redis.call('ZADD', idx, version, key)
    end
  end

  local function enter(s, state, deadline)
    s[1] = state
    s[2] = math.max(s[2] + 1, now)
    s[3] = deadline
    s[4] = 0
  end

  -- OPEN ends at its deadline; a HALF_OPEN round ends at its deadline too (leases of holders
  -- that died have expired by then): a new round, a new generation, fresh leases.
  local function advance(key, s)
    if s[1] ~= 0 and now >= s[3] then
      enter(s, 2, now + lease_ms)
      redis.call('DEL', p .. ':l:' .. key)
      return true
    end
    return false
  end

  local function held_by_me(key)
    local lk = p .. ':l:' .. key
    redis.call('ZREMRANGEBYSCORE', lk, '-inf', now)
    local held = 0
    for i = 0, hmax - 1 do
      if redis.call('ZSCORE', lk, inst .. ':' .. i) then
        held = held + 1
      end
    end
    return held
  end

  -- nodes (not instances) are counted: a set scored by the node's last report
  local function mark(k, horizon)
    redis.call('ZADD', k, now, node)
    redis.call('PEXPIRE', k, horizon + width)
    redis.call('ZREMRANGEBYSCORE', k, '-inf', now - horizon)
    return redis.call('ZCARD', k)
  end

  local function nodes(k, horizon)
    redis.call('ZREMRANGEBYSCORE', k, '-inf', now - horizon)
    return redis.call('ZCARD', k)
  end

  -- The fleet opens on evidence from at least min_instances nodes that are also at least
  -- failure_rate of the nodes that reported the key within the window: nodes whose own
  -- breaker is tripped (a local OPEN verdict, fresh within verdict_ms), or nodes reporting
  -- failures while the window's counts cross min_calls and failure_rate.
  local function count(key, succ, fail, tripped)
    local bk = p .. ':b:' .. key
    if succ > 0 then
      redis.call('HINCRBY', bk, 's' .. cur, succ)
    end
    if fail > 0 then
      redis.call('HINCRBY', bk, 'f' .. cur, fail)
    end
    if succ + fail > 0 then
      redis.call('PEXPIRE', bk, window + width)
    end
    local active = mark(p .. ':a:' .. key, window)
    local failing = 0
    if fail > 0 then
      failing = mark(p .. ':f:' .. key, window)
    end
    local trips = 0
    if tripped then
      trips = mark(p .. ':t:' .. key, verdict_ms)
    elseif fail > 0 then
      trips = nodes(p .. ':t:' .. key, verdict_ms)
    end
    local function enough(c)
      return c >= min_inst and c >= rate * active
    end
    if enough(trips) then
      return true
    end
    if not (fail > 0 or redis.call('HLEN', bk) > 2 * nb + 4) then
      return false
    end
    local all = redis.call('HGETALL', bk)
    local ts, tf = 0, 0
    for i = 1, #all, 2 do
      local field = all[i]
      if tonumber(string.sub(field, 2)) <= cur - nb then
        redis.call('HDEL', bk, field)
      elseif string.sub(field, 1, 1) == 's' then
        ts = ts + tonumber(all[i + 1])
      else
        tf = tf + tonumber(all[i + 1])
      end
    end
    return fail > 0 and ts + tf >= min_calls and tf >= rate * (ts + tf) and enough(failing)
  end

  local function reply(key, s, held)
    local rem = 0
    if s[1] ~= 0 then
      rem = math.max(0, s[3] - now)
    end
    res[#res + 1] = key
    res[#res + 1] = s[1]
    res[#res + 1] = s[2]
    res[#res + 1] = rem
    res[#res + 1] = held
  end

  for e = first, a - 1, 5 do
    local key = ARGV[e]
    local succ = tonumber(ARGV[e + 1])
    local fail = tonumber(ARGV[e + 2])
    local want = tonumber(ARGV[e + 3])
    local flags = tonumber(ARGV[e + 4])
    seen[key] = true
    local s = load(key)
    if flags >= 2 then
      -- an explicit fleet reset: CLOSED with a new generation, whatever was there
      local gen = now
      if s then
        gen = math.max(s[2] + 1, now)
      end
      wipe(key)
      s = { 0, gen, 0, 0 }
      version = version + 1
      flags = flags - 2
      reply(key, s, 0)
    elseif not s or not sound(key) then
      bad[#bad + 1] = key
    else
      local changed = advance(key, s)
      local held = 0
      if s[1] == 2 then
        held = held_by_me(key)
      end
      if s[1] == 0 and (succ + fail > 0 or flags == 1) then
        if count(key, succ, fail, flags == 1) then
          enter(s, 1, now + open_ms)
          changed = true
        end
      elseif s[1] == 2 and held > 0 and succ + fail > 0 then
        -- outcomes of a lease holder in HALF_OPEN are probe outcomes
        if fail > 0 then
          enter(s, 1, now + open_ms)
          redis.call('DEL', p .. ':l:' .. key)
          held = 0
        else
          s[4] = s[4] + succ
          if s[4] >= sth then
            enter(s, 0, 0)
            held = 0
          end
        end
        changed = true
      end
      if s[1] == 2 and want > 0 and held == 0 then
        local lk = p .. ':l:' .. key
        local free = hmax - redis.call('ZCARD', lk)
        while free > 0 and held < want do
          redis.call('ZADD', lk, s[3], inst .. ':' .. held)
          held = held + 1
          free = free - 1
        end
        redis.call('PEXPIRE', lk, math.max(1, s[3] - now) + 1000)
      end
      if changed then
        save(key, s)
      end
      reply(key, s, held)
    end
  end

  -- news: keys not CLOSED whose record changed since this instance's last sync
  local news = redis.call('ZRANGEBYSCORE', idx, '(' .. since, '+inf')
  for _, key in ipairs(news) do
    if not seen[key] then
      local s = load(key)
      if not s or not typed(p .. ':l:' .. key, 'zset') then
        bad[#bad + 1] = key
      else
        if advance(key, s) then
          save(key, s)
        end
        reply(key, s, 0)
      end
    end
  end
  redis.call('SET', p .. ':v', version)
  out[#out + 1] = { version, res, bad, epoch }
  end
end

-- Retry budgets: one pool per fleet of capacity x instances (those that synced within the
-- window), charged with every instance's change; each instance holds pool / instances.
for j = 1, nbudgets do
  local p = KEYS[ngroups + j]
  local delta = tonumber(ARGV[a])
  local cap = tonumber(ARGV[a + 1])
  a = a + 2
  local ik = p .. ':i'
  local pool = false
  local sound = typed(ik, 'zset') and typed(p .. ':p', 'string')
  if sound then
    pool = redis.call('GET', p .. ':p')
    sound = not pool or int(pool) ~= nil
  end
  if not sound then
    out[#out + 1] = -1 -- a malformed pool: this budget is skipped, the others go on
  else
    local joined = redis.call('ZADD', ik, now, inst)
    redis.call('ZREMRANGEBYSCORE', ik, '-inf', now - window)
    redis.call('PEXPIRE', ik, window * 2)
    local n = redis.call('ZCARD', ik)
    if not pool then
      pool = cap * n
    else
      pool = int(pool) + joined * cap -- a new instance brings its full bucket
    end
    pool = math.min(math.max(pool + delta, 0), cap * n)
    redis.call('SET', p .. ':p', string.format('%d', pool), 'PX', window * 2)
    out[#out + 1] = math.min(cap, math.floor(pool / n))
  end
end
return out
"""
