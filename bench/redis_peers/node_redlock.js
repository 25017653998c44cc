// node-redlock (the npm package redlock, on ioredis) with one Redis, uncontended
// acquire + release, beside distlock's redis://. Run by scripts/bench_redis.sh with
// PEERS=1, which installs the two packages into a temporary directory (nothing of
// them is kept). Prints one JSON line. A measurement, not a test.
//   node node_redlock.js PORT OPS WARMUP
"use strict";
const Redis = require("ioredis");
const Redlock = require("redlock");

async function main() {
  const [port, ops, warmup] = process.argv.slice(2).map(Number);
  const client = new Redis({ host: "127.0.0.1", port });
  const redlock = new Redlock([client], { retryCount: 0 });
  const key = "peerbench:node-redlock";
  for (let i = 0; i < warmup; ++i) await (await redlock.lock(key, 30000)).unlock();
  const lat = [];
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < ops; ++i) {
    const a = process.hrtime.bigint();
    const lock = await redlock.lock(key, 30000);
    await lock.unlock();
    lat.push(Number(process.hrtime.bigint() - a));
  }
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  lat.sort((x, y) => x - y);
  const pct = (p) => Math.round(lat[Math.floor(p * (lat.length - 1))] / 100) / 10;
  const version = require("redlock/package.json").version;
  console.log(JSON.stringify({ workload: "peer-uncontended", impl: "node-redlock " + version,
    url: `redis://127.0.0.1:${port}`, ops, ops_per_s: Math.round((ops / seconds) * 10) / 10,
    p50_us: pct(0.5), p99_us: pct(0.99), p999_us: pct(0.999) }));
  client.disconnect();
}

main().catch((e) => { console.error("node-redlock bench:", e.message); process.exit(1); });
