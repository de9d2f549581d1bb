package main

import (
	"crypto/sha256"
	"encoding/hex"
	"io"

	"github.com/spf13/cobra"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/proto"
)

// group returns a command that only holds subcommands: run alone or with
// an unknown subcommand, it is a bad command line (exit 2), not help.
func (a *app) group(use, short, long string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.ArbitraryArgs,
		RunE: a.wrap(func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErr("unknown %s command %q", cmd.Name(), args[0])
			}
			return usageErr("%s needs a command: %s", cmd.Name(), subNames(cmd))
		}),
	}
}

func subNames(cmd *cobra.Command) string {
	s := ""
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			if s != "" {
				s += ", "
			}
			s += c.Name()
		}
	}
	return s
}

func (a *app) aclCmd() *cobra.Command {
	acl := a.group("acl", "help with lockd's ACL file (--acl)",
		`Commands that help write the identity file of lockd's --acl (docs/PROTOCOL.md §8.2).`)
	acl.AddCommand(a.aclHashCmd())
	return acl
}

// hashJSON is acl hash's -o json document.
type hashJSON struct {
	Secret string `json:"secret"` // the ACL file's secret field: "sha256:" and the hex digest
}

func (a *app) aclHashCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hash",
		Short: "print the sha256: line of a secret read from stdin, for the ACL file",
		Long: `hash reads a secret from standard input and prints the form lockd's ACL file
holds in its secret field: "sha256:" and the lowercase hex SHA-256 of the
secret's bytes. One trailing newline ("\n" or "\r\n") is removed, and nothing
else: spaces are part of the secret. This is the rule --secret-file follows
too, so a file made with echo or an editor hashes to what the client sends.
The secret must be 1..256 bytes on one line (what a hello can carry).

The secret never appears on a command line: pipe it in from its file.`,
		Example: `  lockctl acl hash < orders.secret
  printf %s orders-secret | lockctl acl hash    # the example of PROTOCOL.md §8.2
  sha256:363838865d67245f6045a510d660614ae477cd64df9f55f5c068b20a1536949a

  # a new identity: a random secret, its file for the client, its line for --acl
  (umask 077; openssl rand -hex 32 > orders.secret)
  echo "orders $(lockctl acl hash < orders.secret) orders/,jobs/ client" >> acl.txt`,
		Args: args(0, "acl hash takes no arguments: it reads the secret from stdin"),
	}
	o := a.outputFlag(cmd)
	cmd.RunE = a.wrap(func(cmd *cobra.Command, _ []string) error {
		if err := a.checkOutput(o); err != nil {
			return err
		}
		b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), proto.MaxSecret+3))
		if err != nil {
			return &exitErr{code: exitError, msg: "reading the secret from stdin: " + err.Error()}
		}
		secret := client.TrimSecret(b)
		switch {
		case len(secret) == 0:
			return usageErr("no secret on stdin")
		case len(secret) > proto.MaxSecret:
			return usageErr("the secret is longer than %d bytes (what a hello can carry)", proto.MaxSecret)
		}
		for _, c := range secret {
			if c == '\n' {
				return usageErr("the secret has a newline before its end: a secret is one line")
			}
		}
		sum := sha256.Sum256(secret)
		clear(b)
		line := "sha256:" + hex.EncodeToString(sum[:])
		return o.result(a.stdout, line+"\n", hashJSON{Secret: line})
	})
	return cmd
}
