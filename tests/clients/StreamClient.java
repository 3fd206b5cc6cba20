// Java's own HTTP client (java.net.http.HttpClient, JDK 11+), for
// tests/clients.rs: run as a single file, `java StreamClient.java <url>`.
// Prints every line of the stream as it arrives; a refusal prints
// "ERROR: <status> <body>" and exits 1. Built as a Java program would: the
// client's defaults (it offers an h2c upgrade on http:// and sends
// Content-Length: 0 with it).
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.stream.Stream;

public class StreamClient {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
        HttpRequest request = HttpRequest.newBuilder(URI.create(args[0])).GET().build();
        HttpResponse<Stream<String>> response = client.send(request, HttpResponse.BodyHandlers.ofLines());
        if (response.statusCode() != 200) {
            StringBuilder body = new StringBuilder();
            response.body().forEach(body::append);
            System.out.println("ERROR: " + response.statusCode() + " " + body);
            System.exit(1);
        }
        response.body().forEach(line -> {
            System.out.println(line);
            System.out.flush();
        });
    }
}
