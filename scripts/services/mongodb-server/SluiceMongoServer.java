// The MongoDB-wire emulator for Sluice's tests (scripts/services/mongodb): mongo-java-server's in-memory
// backend with the oplog enabled (so change streams work), bound to 127.0.0.1:PORT until SIGTERM.
// Usage: java -cp 'LIBS/*:CLASSES' SluiceMongoServer PORT
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;

public final class SluiceMongoServer {
  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: SluiceMongoServer PORT");
      System.exit(2);
    }
    int port = Integer.parseInt(args[0]);
    MongoServer server = new MongoServer(new MemoryBackend());
    server.enableOplog();
    server.bind("127.0.0.1", port);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      System.out.println("SluiceMongoServer: shutting down");
      server.shutdownNow();
    }));
    System.out.println("SluiceMongoServer: listening on " + server.getLocalAddress() + " (oplog enabled)");
    System.out.flush();
    Thread.currentThread().join();
  }
}
