// rate-limiter-flexible (RateLimiterRedis: its fixed window, one Lua script per consume) on a
// private Redis, for benches/scripts/redis_cpu.sh.
//
//   node bench.js PORT N KEYS CONCURRENCY
//
// Sends N consumes over one ioredis connection, CONCURRENCY in flight, on KEYS distinct keys
// (a quota no request reaches), after a warm-up that creates every key; prints one line of
// JSON: decisions per second, and Redis's own usec_per_call of the script command
// (INFO commandstats after CONFIG RESETSTAT, so only the measured consumes count).
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

async function main() {
  const [port, n, keys, conc] = process.argv.slice(2).map(Number);
  const redis = new Redis({ port, host: '127.0.0.1', enableOfflineQueue: true });
  const limiter = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: `rlfbench${process.pid}`,
    points: 1e12,
    duration: 3600,
  });
  for (let k = 0; k < keys; k++) await limiter.consume(`k${k}`);
  await redis.config('RESETSTAT');
  let next = 0;
  const start = process.hrtime.bigint();
  async function worker() {
    while (next < n) {
      const i = next++;
      await limiter.consume(`k${i % keys}`);
    }
  }
  await Promise.all(Array.from({ length: conc }, worker));
  const secs = Number(process.hrtime.bigint() - start) / 1e9;
  const stats = await redis.info('commandstats');
  const usec = {};
  for (const m of stats.matchAll(/cmdstat_(\w+):calls=(\d+),usec=(\d+),usec_per_call=([\d.]+)/g)) {
    usec[m[1]] = { calls: Number(m[2]), usec_per_call: Number(m[4]) };
  }
  const script = usec.evalsha || usec.eval || {};
  console.log(JSON.stringify({ side: 'rlf_fixed', decisions_per_s: n / secs, usec_per_call: script.usec_per_call, calls: script.calls, commands: usec }));
  redis.disconnect();
}
main().catch((e) => { console.error(e); process.exit(1); });
