"""The Lua script of one fleet sync (``fastbreaker.contrib.redis``), run by Redis itself."""

SCRIPT = r"""
-- fastbreaker.contrib.redis: one call of this script is one sync of one slot group.
-- KEYS[g] is a group's prefix (a hash tag: every key the script derives from it is in its slot).
-- ARGV: instance, window_ms, min_instances, buckets, budgets, then per group:
--   since, n, failure_rate, min_calls, half_open_max, success_threshold, open_ms, lease_ms,
--   then n entries of key, successes, failures, want (leases wanted).
-- then per budget (the last KEYS): the local change in token units, capacity in units.
-- Reply per group: {version, {key, state, gen, remaining_ms, leases, ...}}; then per budget:
-- this instance's share of the fleet's pool, in units.
-- State record (hash <p>:st, field key): "state gen until probe_ok"; CLOSED keys have none.
-- Generations: max(gen + 1, now_ms), so they keep growing if the server loses its data.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local inst = ARGV[1]
local window = tonumber(ARGV[2])
local min_inst = tonumber(ARGV[3])
local nb = tonumber(ARGV[4])
local nbudgets = tonumber(ARGV[5])
local ngroups = #KEYS - nbudgets
local width = math.max(1, math.floor(window / nb))
local cur = math.floor(now / width)
local a = 6
local out = {}

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
  a = a + 8
  local stkey = p .. ':st'
  local idx = p .. ':o'
  local version = tonumber(redis.call('GET', p .. ':v') or '0')
  if since > version then
    since = 0 -- the server lost its data: everything is news
  end
  local res = {}
  local seen = {}

  local function load(key)
    local raw = redis.call('HGET', stkey, key)
    if not raw then
      return { 0, now, 0, 0 }
    end
    local s = {}
    for x in string.gmatch(raw, '%S+') do
      s[#s + 1] = tonumber(x)
    end
    return s
  end

  local function save(key, s)
    version = version + 1
    if s[1] == 0 then
      redis.call('HDEL', stkey, key)
      redis.call('ZREM', idx, key)
      redis.call('DEL', p .. ':b:' .. key, p .. ':f:' .. key, p .. ':l:' .. key)
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

  for _ = 1, n do
    local key = ARGV[a]
    local succ = tonumber(ARGV[a + 1])
    local fail = tonumber(ARGV[a + 2])
    local want = tonumber(ARGV[a + 3])
    a = a + 4
    seen[key] = true
    local s = load(key)
    local changed = advance(key, s)
    local held = 0
    if s[1] == 2 then
      held = held_by_me(key)
    end
    if s[1] == 0 and succ + fail > 0 then
      local bk = p .. ':b:' .. key
      if succ > 0 then
        redis.call('HINCRBY', bk, 's' .. cur, succ)
      end
      if fail > 0 then
        redis.call('HINCRBY', bk, 'f' .. cur, fail)
        redis.call('ZADD', p .. ':f:' .. key, now, inst)
        redis.call('PEXPIRE', p .. ':f:' .. key, window + width)
      end
      redis.call('PEXPIRE', bk, window + width)
      if fail > 0 or redis.call('HLEN', bk) > 2 * nb + 4 then
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
        if fail > 0 and ts + tf >= min_calls and tf >= rate * (ts + tf) then
          local fk = p .. ':f:' .. key
          redis.call('ZREMRANGEBYSCORE', fk, '-inf', now - window)
          if redis.call('ZCARD', fk) >= min_inst then
            enter(s, 1, now + open_ms)
            changed = true
          end
        end
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

  -- news: keys not CLOSED whose record changed since this instance's last sync
  local news = redis.call('ZRANGEBYSCORE', idx, '(' .. since, '+inf')
  for _, key in ipairs(news) do
    if not seen[key] then
      local s = load(key)
      if advance(key, s) then
        save(key, s)
      end
      local rem = 0
      if s[1] ~= 0 then
        rem = math.max(0, s[3] - now)
      end
      res[#res + 1] = key
      res[#res + 1] = s[1]
      res[#res + 1] = s[2]
      res[#res + 1] = rem
      res[#res + 1] = 0
    end
  end
  redis.call('SET', p .. ':v', version)
  out[#out + 1] = { version, res }
end

-- Retry budgets: one pool per fleet of capacity x instances (those that synced within the
-- window), charged with every instance's change; each instance holds pool / instances.
for j = 1, nbudgets do
  local p = KEYS[ngroups + j]
  local delta = tonumber(ARGV[a])
  local cap = tonumber(ARGV[a + 1])
  a = a + 2
  local ik = p .. ':i'
  local joined = redis.call('ZADD', ik, now, inst)
  redis.call('ZREMRANGEBYSCORE', ik, '-inf', now - window)
  redis.call('PEXPIRE', ik, window * 2)
  local n = redis.call('ZCARD', ik)
  local pool = redis.call('GET', p .. ':p')
  if not pool then
    pool = cap * n
  else
    pool = tonumber(pool) + joined * cap -- a new instance brings its full bucket
  end
  pool = math.min(math.max(pool + delta, 0), cap * n)
  redis.call('SET', p .. ':p', string.format('%d', pool), 'PX', window * 2)
  out[#out + 1] = math.min(cap, math.floor(pool / n))
end
return out
"""
