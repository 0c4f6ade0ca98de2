// Our own small authenticator for the real Aeron Archive (io.aeron:aeron-all), for the
// credentials tests: compiled by the test with javac into a temporary directory and named by
// the archive's -Daeron.archive.authenticator.supplier=TestArchiveAuthenticator. Nothing of
// Aeron is kept here.
//
// The secret is read from the file named by -Daeronspark.test.secret.file (never printed).
// A connect whose credentials are
//   * the secret: accepted;
//   * "challenge-me": challenged with "nonce:<random hex>"; the answer "<random hex>:<secret>"
//     is accepted, any other answer refused;
//   * anything else, or none: refused (the archive answers AUTHENTICATION_REJECTED).
import io.aeron.security.Authenticator;
import io.aeron.security.AuthenticatorSupplier;
import io.aeron.security.SessionProxy;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

public final class TestArchiveAuthenticator implements AuthenticatorSupplier
{
    public Authenticator get()
    {
        return new Auth();
    }

    static final class Auth implements Authenticator
    {
        private static final byte[] CHALLENGE_ME = "challenge-me".getBytes(StandardCharsets.US_ASCII);
        private final byte[] secret;
        private final SecureRandom random = new SecureRandom();
        private final Map<Long, byte[]> credentials = new HashMap<>();
        private final Map<Long, String> nonces = new HashMap<>();
        private final Map<Long, byte[]> answers = new HashMap<>();

        Auth()
        {
            try
            {
                byte[] bytes = Files.readAllBytes(Paths.get(System.getProperty("aeronspark.test.secret.file")));
                this.secret = bytes;
            }
            catch (final Exception ex)
            {
                throw new IllegalStateException("cannot read the secret file", ex);
            }
        }

        public void onConnectRequest(final long sessionId, final byte[] encodedCredentials, final long nowMs)
        {
            credentials.put(sessionId, null == encodedCredentials ? new byte[0] : encodedCredentials);
        }

        public void onChallengeResponse(final long sessionId, final byte[] encodedCredentials, final long nowMs)
        {
            answers.put(sessionId, null == encodedCredentials ? new byte[0] : encodedCredentials);
        }

        public void onConnectedSession(final SessionProxy proxy, final long nowMs)
        {
            final long id = proxy.sessionId();
            final byte[] given = credentials.get(id);
            if (null == given)
            {
                proxy.reject();
            }
            else if (secret.length > 0 && MessageDigest.isEqual(given, secret))
            {
                // authenticate() is false when the response could not be sent yet (the archive
                // calls again next cycle): forget the credentials only once it went out, or the
                // retry finds none and rejects a right secret
                if (proxy.authenticate("aeron-spark-test".getBytes(StandardCharsets.US_ASCII)))
                {
                    credentials.remove(id);
                }
            }
            else if (Arrays.equals(given, CHALLENGE_ME))
            {
                final String nonce = nonces.computeIfAbsent(id, k -> Long.toHexString(random.nextLong()));
                if (proxy.challenge(("nonce:" + nonce).getBytes(StandardCharsets.US_ASCII)))
                {
                    credentials.remove(id);
                }
            }
            else
            {
                credentials.remove(id);
                proxy.reject();
            }
        }

        public void onChallengedSession(final SessionProxy proxy, final long nowMs)
        {
            final long id = proxy.sessionId();
            final byte[] answer = answers.get(id);
            if (null == answer)
            {
                return; // not answered yet
            }
            final String nonce = nonces.get(id);
            final byte[] prefix = (nonce + ":").getBytes(StandardCharsets.US_ASCII);
            final byte[] expected = new byte[prefix.length + secret.length];
            System.arraycopy(prefix, 0, expected, 0, prefix.length);
            System.arraycopy(secret, 0, expected, prefix.length, secret.length);
            if (null != nonce && MessageDigest.isEqual(answer, expected))
            {
                if (!proxy.authenticate("aeron-spark-test".getBytes(StandardCharsets.US_ASCII)))
                {
                    return; // the response could not be sent yet: called again next cycle
                }
            }
            else
            {
                proxy.reject();
            }
            answers.remove(id);
            nonces.remove(id);
        }
    }
}
