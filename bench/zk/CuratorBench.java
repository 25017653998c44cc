// Apache Curator's InterProcessMutex, uncontended acquire + release, for comparison
// with distlock's zk:// backend (bench/zk/run.sh compiles it with javac against
// Debian's libcurator-recipes-java). Prints one JSON line. A measurement, not a test.
import java.util.Arrays;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public final class CuratorBench {
  public static void main(String[] args) throws Exception {
    String hosts = "127.0.0.1:2181";
    int ops = 5000;
    int warmup = 500;
    for (int i = 0; i + 1 < args.length; i += 2) {
      switch (args[i]) {
        case "--hosts": hosts = args[i + 1]; break;
        case "--ops": ops = Integer.parseInt(args[i + 1]); break;
        case "--warmup": warmup = Integer.parseInt(args[i + 1]); break;
        default: throw new IllegalArgumentException("unknown flag " + args[i]);
      }
    }
    try (CuratorFramework client = CuratorFrameworkFactory.newClient(hosts, 10_000, 10_000, new RetryOneTime(100))) {
      client.start();
      client.blockUntilConnected();
      InterProcessMutex mutex = new InterProcessMutex(client, "/curatorbench/uncontended");
      for (int i = 0; i < warmup; ++i) {
        mutex.acquire();
        mutex.release();
      }
      long[] lat = new long[ops];
      long t0 = System.nanoTime();
      for (int i = 0; i < ops; ++i) {
        long a = System.nanoTime();
        mutex.acquire();
        mutex.release();
        lat[i] = System.nanoTime() - a;
      }
      double seconds = (System.nanoTime() - t0) / 1e9;
      Arrays.sort(lat);
      System.out.printf(java.util.Locale.ROOT,
          "{\"workload\":\"uncontended\",\"impl\":\"curator-interprocessmutex\",\"url\":\"zk://%s\",\"ops\":%d,"
              + "\"ops_per_s\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f}%n",
          hosts, ops, ops / seconds, lat[(int) (0.50 * (ops - 1))] / 1e3, lat[(int) (0.99 * (ops - 1))] / 1e3,
          lat[(int) (0.999 * (ops - 1))] / 1e3);
    }
  }
}
