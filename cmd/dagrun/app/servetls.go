package app

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// serveTLS is the certificate `serve --tls-cert --tls-key` answers with,
// read again when either file changes, so that a renewed certificate
// (certbot, cert-manager, a cron job) is served without a restart. Each
// new connection's handshake stats the two files (connections are kept
// alive, so a browser or a script shakes hands rarely) and reloads the
// pair when either differs in inode, size or modification time: the
// clock that stamps files ticks in milliseconds, so two writes within
// one tick would share a time. A pair that does not load is logged and
// the last good one kept, so a renewal caught between writing the two
// files never takes the server down.
type serveTLS struct {
	certFile, keyFile string
	logger            *slog.Logger

	mu         sync.Mutex
	cert       *tls.Certificate
	loaded     [2]os.FileInfo // the files the pair was read from
	warnedOf   [2]os.FileInfo // the files a failed reload was logged for
	loadFailed bool
}

// loadServeTLS reads the key pair that serve's --tls-cert and --tls-key
// name. Both or neither must be given; a pair that does not load is the
// user's to fix (exit 2), before anything is opened.
func loadServeTLS(certFile, keyFile string, logger *slog.Logger) (*serveTLS, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "":
		return nil, usageError(errors.New("--tls-key needs --tls-cert (env DAGRUN_TLS_CERT): give the certificate file too, or neither to serve plain HTTP"))
	case keyFile == "":
		return nil, usageError(errors.New("--tls-cert needs --tls-key (env DAGRUN_TLS_KEY): give the private key file too, or neither to serve plain HTTP"))
	}
	s := &serveTLS{certFile: certFile, keyFile: keyFile, logger: logger}
	files, err := s.stat()
	if err == nil {
		err = s.load(files)
	}
	if err != nil {
		return nil, usageError(fmt.Errorf("--tls-cert %s --tls-key %s: %w (give a PEM certificate chain and its PEM private key)", certFile, keyFile, err))
	}
	return s, nil
}

// config is the server's TLS configuration: TLS 1.2 at least and Go's
// default cipher suites (http.Server.ServeTLS adds HTTP/2).
func (s *serveTLS) config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.certificate}
}

// stat returns the certificate's and the key's file information.
func (s *serveTLS) stat() ([2]os.FileInfo, error) {
	var files [2]os.FileInfo
	for i, name := range []string{s.certFile, s.keyFile} {
		fi, err := os.Stat(name)
		if err != nil {
			return files, err
		}
		files[i] = fi
	}
	return files, nil
}

// sameFiles reports whether a and b describe the same two files unchanged
// (or both found the same one missing).
func sameFiles(a, b [2]os.FileInfo) bool {
	for i := range a {
		if a[i] == nil || b[i] == nil {
			if a[i] != b[i] {
				return false
			}
			continue
		}
		if !os.SameFile(a[i], b[i]) || a[i].Size() != b[i].Size() || !a[i].ModTime().Equal(b[i].ModTime()) {
			return false
		}
	}
	return true
}

// load reads the pair and keeps it with the files it was read from; the
// caller holds mu, or is loadServeTLS.
func (s *serveTLS) load(files [2]os.FileInfo) error {
	cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return err
	}
	s.cert, s.loaded = &cert, files
	return nil
}

// certificate is tls.Config.GetCertificate: the pair as the files hold it
// now, or the last one that loaded.
func (s *serveTLS) certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	files, err := s.stat()
	if err != nil {
		s.warn(files, err)
		return s.cert, nil
	}
	if sameFiles(files, s.loaded) {
		return s.cert, nil
	}
	if err := s.load(files); err != nil {
		s.warn(files, err)
		return s.cert, nil
	}
	s.loadFailed = false
	s.logger.Info("dagrun serve reloaded its TLS certificate", "cert", s.certFile, "key", s.keyFile)
	return s.cert, nil
}

// warn logs a failed reload once per change of the files, not once per
// handshake.
func (s *serveTLS) warn(files [2]os.FileInfo, err error) {
	if s.loadFailed && sameFiles(files, s.warnedOf) {
		return
	}
	s.loadFailed, s.warnedOf = true, files
	s.logger.Warn("dagrun serve keeps its last TLS certificate: the files do not load", "cert", s.certFile, "key", s.keyFile, slog.Any("error", err))
}
