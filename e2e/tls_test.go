package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// selfSigned returns a PEM certificate for 127.0.0.1 named cn, and its
// PEM private key.
func selfSigned(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// trusting returns a client that trusts only certPEM, on fresh
// connections (so each request shakes hands) and offering HTTP/2.
func trusting(t *testing.T, certPEM []byte) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(certPEM))
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2: true,
		DisableKeepAlives: true,
	}}
}

// TestServeTLS: with --tls-cert and --tls-key, serve answers HTTPS (and
// HTTP/2) with that certificate, refuses plain HTTP, serves a renewed
// certificate once the files change without a restart, and keeps the
// last good one while the files do not load.
func TestServeTLS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, filepath.Join(t.TempDir(), "dagrun.db"), nil)
	certFile, keyFile := filepath.Join(e.dir, "cert.pem"), filepath.Join(e.dir, "key.pem")
	first, firstKey := selfSigned(t, "first")
	require.NoError(t, os.WriteFile(certFile, first, 0o644))
	require.NoError(t, os.WriteFile(keyFile, firstKey, 0o600))

	p := e.spawn(t, "serve", "--addr", "127.0.0.1:0", "--no-schedules", "--tls-cert", certFile, "--tls-key", keyFile, "--token", "s3cret")
	listening := regexp.MustCompile(`url=(https://127\.0\.0\.1:\d+)/`)
	var base string
	require.Eventually(t, func() bool {
		if m := listening.FindStringSubmatch(p.stderr.String()); m != nil {
			base = m[1]
		}
		return base != "" || !p.running()
	}, 30*time.Second, 10*time.Millisecond)
	require.NotEmpty(t, base, "dagrun serve did not start:\n%s", p.stderr.String())

	// get fetches path with client and returns the common name of the
	// certificate the server presented.
	get := func(client *http.Client, path string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer s3cret")
		resp, err := client.Do(req)
		require.NoError(t, err, "GET %s", path)
		require.NoError(t, resp.Body.Close())
		require.NotNil(t, resp.TLS)
		return resp, resp.TLS.PeerCertificates[0].Subject.CommonName
	}
	resp, cn := get(trusting(t, first), "/healthz")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "first", cn)
	require.Equal(t, 2, resp.ProtoMajor, "HTTP/2 over TLS")
	resp, _ = get(trusting(t, first), "/api/workflows")
	require.Equal(t, http.StatusOK, resp.StatusCode, "the token still guards the API")

	// Plain HTTP to the HTTPS port: net/http's 400, never the API.
	plain, err := http.Get(strings.Replace(base, "https://", "http://", 1) + "/api/workflows")
	require.NoError(t, err)
	require.NoError(t, plain.Body.Close())
	require.Equal(t, http.StatusBadRequest, plain.StatusCode)

	// A renewal: the key first, then the certificate, as a tool writing
	// the two files would; the next handshake gets the new pair.
	second, secondKey := selfSigned(t, "second")
	require.NoError(t, os.WriteFile(keyFile, secondKey, 0o600))
	require.NoError(t, os.WriteFile(certFile, second, 0o644))
	_, cn = get(trusting(t, second), "/healthz")
	require.Equal(t, "second", cn)
	_, err = trusting(t, first).Get(base + "/healthz")
	require.Error(t, err, "the first certificate is no longer served")
	require.Contains(t, p.stderr.String(), "reloaded its TLS certificate")

	// Files that do not load: the last good pair stays, and the log says
	// so once, not at every handshake.
	require.NoError(t, os.WriteFile(certFile, []byte("not a certificate\n"), 0o644))
	for range 3 {
		_, cn = get(trusting(t, second), "/healthz")
		require.Equal(t, "second", cn)
	}
	require.Equal(t, 1, strings.Count(p.stderr.String(), "keeps its last TLS certificate"), p.stderr.String())
	// A missing file, as when a tool replaces it: the same.
	require.NoError(t, os.Remove(certFile))
	for range 3 {
		_, cn = get(trusting(t, second), "/healthz")
		require.Equal(t, "second", cn)
	}
	require.Equal(t, 2, strings.Count(p.stderr.String(), "keeps its last TLS certificate"), p.stderr.String())
	require.True(t, p.running())
}
