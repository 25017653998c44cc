// The same workload as redlock_bench (uncontended acquire+release, one key) with
// node-redlock over ioredis clients, for comparison. Installed by run.sh into a
// temporary directory; prints one JSON line.
//
//   node node_redlock_bench.js 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 [ops] [ttl_ms]
'use strict';
const Redis = require('ioredis');
const Redlock = require('redlock');

const masters = process.argv[2].split(',');
const ops = Number(process.argv[3] || 5000);
const ttl = Number(process.argv[4] || 10000);
const warmup = Math.min(500, ops);

async function main() {
  const clients = masters.map((hp) => {
    const i = hp.lastIndexOf(':');
    return new Redis({ host: hp.slice(0, i), port: Number(hp.slice(i + 1)), maxRetriesPerRequest: 1 });
  });
  const redlock = new Redlock(clients, { driftFactor: 0.01, retryCount: 0 });
  redlock.on('clientError', (err) => console.error('node-redlock client error:', err.message));
  const once = async () => {
    const lock = await redlock.lock('bench:node:lock', ttl);
    await lock.unlock();
  };
  for (let i = 0; i < warmup; i++) await once();
  const us = [];
  const start = process.hrtime.bigint();
  for (let i = 0; i < ops; i++) {
    const t0 = process.hrtime.bigint();
    await once();
    us.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  us.sort((a, b) => a - b);
  const pct = (p) => us[Math.min(us.length - 1, Math.floor(p * us.length))];
  console.log(JSON.stringify({
    bench: 'redlock_uncontended',
    impl: 'node_redlock_' + require('redlock/package.json').version,
    masters: masters.length,
    ops,
    ops_per_s: ops / seconds,
    p50_us: pct(0.5),
    p99_us: pct(0.99),
    p999_us: pct(0.999),
  }));
  clients.forEach((c) => c.disconnect());
}

main().catch((e) => {
  console.error('node_redlock_bench:', e.message);
  process.exit(1);
});
