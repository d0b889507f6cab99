package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// WithTLS also serves TLS on a second free port, with a certificate for 127.0.0.1 signed by a
// throw-away CA that the harness generates. On a cluster (StartCluster) the nodes share the CA and
// also speak TLS to each other on the cluster bus (--tls-cluster yes). Clients connect to TLSURL and trust TLSConfig's CA
// (or the PEM file TLSCAFile); the plain port stays open for the harness and for admin clients.
// The CA also signs a client certificate (TLSClientFiles), which the server checks when
// WithTLSClientAuth asks it to.
func WithTLS() Option { return func(c *config) { c.tls = true } }

// WithTLSClientAuth is WithTLS with a server that requires a client certificate signed by its CA
// (--tls-auth-clients yes) on the TLS port. TLSConfig then presents the harness's client
// certificate.
func WithTLSClientAuth() Option { return func(c *config) { c.tls, c.tlsClientAuth = true, true } }

// tlsFiles are the PEM files of a server's TLS set-up.
type tlsFiles struct {
	ca, cert, key         string
	clientCert, clientKey string
	pool                  *x509.CertPool
	client                tls.Certificate
}

// TLSCAFile returns the path of the PEM file of the CA that signed the server's and the client's
// certificates ("" without WithTLS).
func (s *Server) TLSCAFile() string {
	if s.tls == nil {
		return ""
	}
	return s.tls.ca
}

// TLSClientFiles returns the paths of the PEM files of a client certificate and its key, signed
// by the server's CA ("", "" without WithTLS).
func (s *Server) TLSClientFiles() (cert, key string) {
	if s.tls == nil {
		return "", ""
	}
	return s.tls.clientCert, s.tls.clientKey
}

// TLSAddr returns the host:port of the TLS listener ("" without WithTLS).
func (s *Server) TLSAddr() string {
	if s.tlsPort == 0 {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tlsPort))
}

// TLSURL returns the rediss:// URL of the TLS listener ("" without WithTLS).
func (s *Server) TLSURL() string {
	if s.tlsPort == 0 {
		return ""
	}
	return "rediss://" + s.TLSAddr()
}

// TLSConfig returns a client TLS configuration that trusts the server's CA (nil without
// WithTLS).
func (s *Server) TLSConfig() *tls.Config {
	if s.tls == nil {
		return nil
	}
	c := &tls.Config{RootCAs: s.tls.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if s.cfg.tlsClientAuth {
		c.Certificates = []tls.Certificate{s.tls.client}
	}
	return c
}

// writeTLSFiles generates a CA, a server certificate for 127.0.0.1 and a client certificate in
// dir.
func writeTLSFiles(dir string) (*tlsFiles, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// A cluster node presents it on the bus as a client too.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, err
	}
	cliKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	cliTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "redistest client"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	cliDER, err := x509.CreateCertificate(rand.Reader, cliTmpl, caCert, &cliKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	cliKeyDER, err := x509.MarshalECPrivateKey(cliKey)
	if err != nil {
		return nil, err
	}
	f := &tlsFiles{
		ca:         filepath.Join(dir, "ca.crt"),
		cert:       filepath.Join(dir, "server.crt"),
		key:        filepath.Join(dir, "server.key"),
		clientCert: filepath.Join(dir, "client.crt"),
		clientKey:  filepath.Join(dir, "client.key"),
		pool:       x509.NewCertPool(),
		client:     tls.Certificate{Certificate: [][]byte{cliDER}, PrivateKey: cliKey},
	}
	f.pool.AddCert(caCert)
	for path, block := range map[string]*pem.Block{
		f.ca:         {Type: "CERTIFICATE", Bytes: caDER},
		f.cert:       {Type: "CERTIFICATE", Bytes: srvDER},
		f.key:        {Type: "EC PRIVATE KEY", Bytes: keyDER},
		f.clientCert: {Type: "CERTIFICATE", Bytes: cliDER},
		f.clientKey:  {Type: "EC PRIVATE KEY", Bytes: cliKeyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return f, nil
}
