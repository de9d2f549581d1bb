package main

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockd-dev/lockd/client"
)

// Environment variables lockctl reads; a flag given on the command line
// wins over its variable.
const (
	envAddrs      = "LOCKD_ADDRS"       // --addr, comma-separated
	envAdmin      = "LOCKD_ADMIN"       // --admin
	envIdentity   = "LOCKD_IDENTITY"    // --identity
	envSecretFile = "LOCKD_SECRET_FILE" // --secret-file
)

// conn is the flags of every command that talks to lockd: where, how long,
// over TLS or not, as whom.
type conn struct {
	addrs      []string
	timeout    time.Duration
	tls        bool
	tlsCA      string
	tlsCert    string
	tlsKey     string
	serverName string
	identity   string
	secretFile string

	// Set by finish.
	tlsConfig *tls.Config   // nil: plaintext
	secret    client.Secret // "" without an identity

	// Set by the command: the pause before a dropped connection is
	// dialled again (0: the client's default).
	redial time.Duration
}

// connFlags adds the connection flags to cmd.
func connFlags(cmd *cobra.Command) *conn {
	c := &conn{}
	f := cmd.Flags()
	f.SortFlags = false // the command's own flags first, then these
	f.StringArrayVar(&c.addrs, "addr", nil, "server address host:port, repeatable (env "+envAddrs+", comma-separated; default 127.0.0.1:7070)")
	f.DurationVar(&c.timeout, "timeout", 10*time.Second, "network timeout for everything but the wait for a lock")
	f.BoolVar(&c.tls, "tls", false, "connect with TLS, verifying the server with the system's roots (implied by --tls-ca, --tls-cert, --tls-server-name)")
	f.StringVar(&c.tlsCA, "tls-ca", "", "PEM bundle of the CA(s) that sign lockd's certificate; turns TLS on")
	f.StringVar(&c.tlsCert, "tls-cert", "", "PEM client certificate, for a lockd with --tls-client-ca (mutual TLS); with --tls-key")
	f.StringVar(&c.tlsKey, "tls-key", "", "PEM key of --tls-cert")
	f.StringVar(&c.serverName, "tls-server-name", "", "name lockd's certificate must carry (default: the host of each address)")
	f.StringVar(&c.identity, "identity", "", "identity to authenticate as, for a lockd with --acl (env "+envIdentity+")")
	f.StringVar(&c.secretFile, "secret-file", "", "file holding the identity's secret, one trailing newline removed (env "+envSecretFile+"); never give a secret on the command line")
	for _, name := range []string{"tls-ca", "tls-cert", "tls-key"} {
		_ = cmd.MarkFlagFilename(name, "pem", "crt", "cert", "key")
	}
	_ = cmd.MarkFlagFilename("secret-file")
	return c
}

// flagOf names the flag behind a client.FieldError's field.
var flagOf = map[string]string{
	"Identity":      "--identity",
	"Secret":        "--secret-file",
	"TLSFiles.CA":   "--tls-ca",
	"TLSFiles.Cert": "--tls-cert",
	"TLSFiles.Key":  "--tls-key",
}

// fieldErr words a client.FieldError as a bad flag (exit 2); other errors
// pass.
func fieldErr(err error) error {
	var fe *client.FieldError
	if errors.As(err, &fe) {
		if name, ok := flagOf[fe.Field]; ok {
			if fe.Value != "" {
				return usageErr("%s %s: %s", name, fe.Value, fe.Want)
			}
			return usageErr("%s: %s", name, fe.Want)
		}
	}
	return err
}

// finish applies the environment and defaults and loads the TLS files and
// the secret: every flag is checked before anything is sent.
func (c *conn) finish() error {
	if len(c.addrs) == 0 {
		for _, a := range strings.Split(os.Getenv(envAddrs), ",") {
			if a = strings.TrimSpace(a); a != "" {
				c.addrs = append(c.addrs, a)
			}
		}
	}
	if len(c.addrs) == 0 {
		c.addrs = []string{"127.0.0.1:7070"}
	}
	if c.timeout <= 0 {
		return usageErr("--timeout must be positive")
	}
	if c.identity == "" {
		c.identity = os.Getenv(envIdentity)
	}
	if c.secretFile == "" {
		c.secretFile = os.Getenv(envSecretFile)
	}
	switch {
	case c.identity != "" && c.secretFile == "":
		return usageErr("--identity %q needs its secret: --secret-file FILE (or %s)", c.identity, envSecretFile)
	case c.identity == "" && c.secretFile != "":
		return usageErr("--secret-file needs --identity (or %s)", envIdentity)
	case c.secretFile != "":
		s, err := client.LoadSecret(c.secretFile)
		if err != nil {
			var fe *client.FieldError
			if errors.As(err, &fe) {
				return fieldErr(err)
			}
			return usageErr("--secret-file: %v", err) // the path and why, never the content
		}
		c.secret = s
	}
	if c.tls || c.tlsCA != "" || c.tlsCert != "" || c.tlsKey != "" || c.serverName != "" {
		cfg, err := client.LoadTLS(client.TLSFiles{CA: c.tlsCA, Cert: c.tlsCert, Key: c.tlsKey, ServerName: c.serverName})
		if err != nil {
			return fieldErr(err)
		}
		c.tlsConfig = cfg
	}
	cfg := c.config()
	return fieldErr(cfg.Validate())
}

// config is the client's configuration for one command.
func (c *conn) config() client.Config {
	cfg := client.DefaultConfig()
	cfg.Addrs = c.addrs
	cfg.DialTimeout = c.timeout
	cfg.TransportTimeout = c.timeout
	cfg.FailFast = true
	cfg.ReconnectInterval = c.redial
	cfg.TLS = c.tlsConfig
	cfg.Identity = c.identity
	cfg.Secret = c.secret
	return cfg
}

// context bounds one command's network work: the client's own transport
// deadline (--timeout) comes first and names what failed; the context is
// only a backstop.
func (c *conn) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.timeout+time.Second)
}

// client returns a client for one command and checks, with a ping, that
// a server answers: a refused dial on every address fails at once with
// the dial error (FailFast), and a server that accepts and closes at once
// (lockd at --max-conns) is reported as that, before any request that
// could be left indeterminate is sent. The ping also goes behind the
// hello, so refused credentials are reported here.
func (c *conn) client(ctx context.Context) (*client.Client, error) {
	cl, err := client.New(c.config())
	if err != nil {
		return nil, fieldErr(err)
	}
	if _, err := cl.Ping(ctx); err != nil {
		cl.Close()
		return nil, pingErr(err)
	}
	return cl, nil
}

// dial returns a client whose server has answered a ping and the context
// for one command's network work; done releases both.
func (c *conn) dial() (*client.Client, context.Context, func(), error) {
	ctx, cancel := c.context()
	cl, err := c.client(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return cl, ctx, func() { cancel(); cl.Close() }, nil
}

// pingErr words a failed ping: its ErrTimeout is a pong that did not come
// back, not a lock held elsewhere (exit 10).
func pingErr(err error) error {
	if errors.Is(err, client.ErrTimeout) {
		return &exitErr{code: exitError, msg: "no pong within --timeout (" + err.Error() + ")"}
	}
	return err
}

// checkWaitLease validates --wait (0..255s; nil: the command has none) and
// --lease (1s..255s) with messages that name the flag: lease 0 would
// otherwise be the client's default lease, not the 1s..255s the help
// promises.
func checkWaitLease(wait, lease *time.Duration) error {
	if wait != nil && (*wait < 0 || *wait > 255*time.Second) {
		return usageErr("--wait %v: must be 0..255s", *wait)
	}
	if *lease < time.Second || *lease > 255*time.Second {
		return usageErr("--lease %v: must be 1s..255s", *lease)
	}
	return nil
}
