// Baseline for bench/etcd/run.sh: the npm `etcd3` client's Lock, uncontended
// acquire+release on one name, printing one JSON line like distlock-bench.
// run.sh installs `etcd3` with npm into a temporary directory (NODE_PATH).
'use strict';
const { Etcd3 } = require('etcd3');

function arg(name, fallback) {
  const i = process.argv.indexOf('--' + name);
  return i > 0 ? process.argv[i + 1] : fallback;
}

async function main() {
  const endpoints = arg('endpoints', '127.0.0.1:2379');
  const ops = Number(arg('ops', '2000'));
  const warmup = Number(arg('warmup', '200'));
  const ttl = Number(arg('ttl', '30'));
  const client = new Etcd3({ hosts: endpoints.split(',').map((h) => 'http://' + h) });
  const pair = async () => {
    const lock = client.lock('bench-node/uncontended').ttl(ttl);
    await lock.acquire();
    await lock.release();
  };
  for (let i = 0; i < warmup; i++) await pair();
  const lat = [];
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < ops; i++) {
    const a = process.hrtime.bigint();
    await pair();
    lat.push(Number(process.hrtime.bigint() - a));
  }
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  lat.sort((x, y) => x - y);
  const pct = (p) => lat[Math.floor(p * (lat.length - 1))] / 1000;
  console.log(JSON.stringify({
    workload: 'uncontended', impl: 'npm-etcd3-lock', endpoints, ops,
    ops_per_s: ops / seconds, p50_us: pct(0.5), p99_us: pct(0.99), p999_us: pct(0.999),
  }));
  client.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
