// The MongoDB-wire emulator for Sluice's tests (scripts/services/mongodb): mongo-java-server's in-memory
// backend with the oplog enabled (so change streams work), bound to 127.0.0.1:PORT until SIGTERM.
// Usage: java -cp 'LIBS/*:CLASSES' SluiceMongoServer PORT [CERT.pem KEY.pem]
// With CERT and KEY (a PEM certificate chain and its unencrypted PKCS#8 key) the server speaks TLS only
// (mongo-java-server's enableSsl: Netty's SslHandler in front of the wire protocol), as mongod --tlsMode requireTLS.
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import java.io.FileInputStream;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.KeyFactory;
import java.security.PrivateKey;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;

public final class SluiceMongoServer {
  public static void main(String[] args) throws Exception {
    if (args.length != 1 && args.length != 3) {
      System.err.println("usage: SluiceMongoServer PORT [CERT.pem KEY.pem]");
      System.exit(2);
    }
    int port = Integer.parseInt(args[0]);
    MongoServer server = new MongoServer(new MemoryBackend());
    server.enableOplog();
    if (args.length == 3) {
      X509Certificate[] chain;
      try (InputStream in = new FileInputStream(args[1])) {
        chain = CertificateFactory.getInstance("X.509").generateCertificates(in).toArray(new X509Certificate[0]);
      }
      String pem = new String(Files.readAllBytes(Paths.get(args[2])), "US-ASCII");
      if (!pem.contains("-----BEGIN PRIVATE KEY-----")) {
        System.err.println("SluiceMongoServer: " + args[2] + " is not an unencrypted PKCS#8 PEM key (BEGIN PRIVATE KEY)");
        System.exit(2);
      }
      String b64 = pem.replaceAll("-----[A-Z ]+-----", "").replaceAll("\\s", "");
      PrivateKey key = KeyFactory.getInstance(chain[0].getPublicKey().getAlgorithm())
                           .generatePrivate(new PKCS8EncodedKeySpec(Base64.getDecoder().decode(b64)));
      server.enableSsl(key, null, chain);
    }
    server.bind("127.0.0.1", port);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      System.out.println("SluiceMongoServer: shutting down");
      server.shutdownNow();
    }));
    System.out.println("SluiceMongoServer: listening on " + server.getLocalAddress() + " (oplog enabled"
                       + (args.length == 3 ? ", TLS only" : "") + ")");
    System.out.flush();
    Thread.currentThread().join();
  }
}
