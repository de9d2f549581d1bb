package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/version"
)

// Exit codes. run exits with the command's own code when it ran to its end.
const (
	exitOK               = 0
	exitError            = 1  // lockd unreachable (no connection), server error, bad answer
	exitUsage            = 2  // bad command line
	exitTimeout          = 10 // the wait ended with the lock still held elsewhere (T)
	exitBusy             = 11 // the server's queue or capacity is full (B)
	exitIndeterminate    = 12 // the outcome is unknown: the lock may or may not have been granted
	exitNotHeld          = 13 // release/renew: the token is not the key's current grant (N)
	exitLockLost         = 14 // run: the lock was lost while the command ran; the command was killed
	exitUnauthenticated  = 15 // the server refused the identity or requires one (E 5, admin 401)
	exitPermissionDenied = 16 // the identity may not use this key (E 6) or the admin endpoint (403)
	exitLimitMismatch    = 17 // run --shared: the key is held with another limit (E 7)
	exitCannotExec       = 126
	exitNotFound         = 127
)

const exitCodesText = `Exit codes:
  0    success (run: the command's own exit code)
  1    error: lockd unreachable (refused, closed at once, no connection), server error
  2    bad command line
  10   timed out: lockd answered that the lock is held elsewhere (watch: still held after --wait)
  11   server busy (queue or capacity full)
  12   indeterminate: the lock may or may not have been granted
  13   not held: the token is not a current holder of the key (release, renew, validate, watch)
  14   run: the lock was lost while the command ran; the command was killed
  15   unauthenticated: lockd refused the identity, or requires one (--identity, --secret-file)
  16   permission denied: the identity may not lock this key, or read the admin endpoint
  17   limit mismatch: run --shared N, and the key is held with another N
  126  run: the command could not be executed
  127  run: the command was not found`

const rootLong = `lockctl is lockd's command-line client: take, renew and release locks, run a
command while holding one (or one of N shared grants), validate a token, watch
a grant until it ends, see who holds a key, ping a server and show what it is
doing.

Every command that talks to lockd takes --addr (repeatable; env LOCKD_ADDRS,
comma-separated; default 127.0.0.1:7070) and --timeout, the TLS flags (--tls,
--tls-ca, --tls-cert, --tls-key, --tls-server-name) and the credentials
(--identity or LOCKD_IDENTITY, --secret-file or LOCKD_SECRET_FILE: a secret is
never taken from the command line). -o json prints results (and errors, on
stderr) as JSON.

` + exitCodesText

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// app is one invocation: its streams, and what report needs to know.
type app struct {
	stdout, stderr io.Writer
	out            *output // the command's -o, once parsed (nil: text)
	ran            bool    // a command's RunE started: its errors are mapped by report
}

func run(args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr}
	root := a.rootCmd()
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	if !a.ran {
		// Cobra's own errors: an unknown command or flag, a flag value
		// that does not parse, an argument count.
		var ue usageError
		if !errors.As(err, &ue) {
			ue = usageError(err.Error())
		}
		return a.report(ue, cmd)
	}
	return a.report(err, cmd)
}

// rootCmd builds the command tree. A group of subcommands (acl, member)
// is a command without RunE whose children do the work.
func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "lockctl",
		Short:         "lockd's command-line client",
		Long:          rootLong,
		Version:       version.Read("").String(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// An unknown command reaches RunE (a root without Args would be
		// judged by cobra's legacy rules, which let "lockctl" alone print
		// help and exit 0).
		Args: cobra.ArbitraryArgs,
		RunE: a.wrap(func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				msg := fmt.Sprintf("unknown command %q", args[0])
				if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
					msg += "; did you mean " + strings.Join(s, " or ") + "?"
				}
				return usageError(msg)
			}
			fmt.Fprint(a.stderr, cmd.UsageString())
			return &exitErr{code: exitUsage}
		}),
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetVersionTemplate("lockctl {{.Version}}\n")
	root.SetUsageTemplate(usageTemplate)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		msg := err.Error()
		if strings.Contains(msg, "--secret") && !strings.Contains(msg, "--secret-file") {
			msg += " (lockctl reads a secret only from a file: --secret-file or LOCKD_SECRET_FILE)"
		}
		return usageError(msg)
	})
	root.AddGroup(
		&cobra.Group{ID: "locks", Title: "Locks:"},
		&cobra.Group{ID: "servers", Title: "Servers:"},
		&cobra.Group{ID: "setup", Title: "Setting up:"},
	)
	root.SetHelpCommandGroupID("setup")
	root.SetCompletionCommandGroupID("setup")
	for _, c := range []*cobra.Command{a.acquireCmd(), a.releaseCmd(), a.renewCmd(), a.runCmd(), a.validateCmd(), a.watchCmd(), a.inspectCmd()} {
		c.GroupID = "locks"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.pingCmd(), a.statusCmd(), a.memberCmd()} {
		c.GroupID = "servers"
		root.AddCommand(c)
	}
	acl := a.aclCmd()
	acl.GroupID = "setup"
	root.AddCommand(acl)
	// Cobra's completion command (bash, zsh, fish, powershell), made now
	// so that it exits 2 without a shell or with an unknown one, like the
	// other groups.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			g := a.group(c.Use, c.Short, c.Long)
			c.Args, c.RunE = g.Args, g.RunE
			c.Example = `  source <(lockctl completion bash)      # this shell (needs the bash-completion package)
  lockctl completion bash > /etc/bash_completion.d/lockctl
  lockctl completion zsh > "${fpath[1]}/_lockctl"
  lockctl completion fish > ~/.config/fish/completions/lockctl.fish`
		}
	}
	return root
}

// usageTemplate is cobra's, with the usage line on the first line (as
// "Usage: lockctl acquire KEY [flags]") and no "Global Flags": every
// command lists the flags it takes, and only those.
const usageTemplate = `Usage: {{if .HasAvailableSubCommands}}{{.CommandPath}} COMMAND [flags]{{else}}{{.UseLine}}{{end}}{{if gt (len .Aliases) 0}}

Aliases:
  {{.NameAndAliases}}{{end}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableSubCommands}}{{$cmds := .Commands}}{{if eq (len .Groups) 0}}

Commands:{{range $cmds}}{{if (or .IsAvailableCommand (eq .Name "help"))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{else}}{{range $group := .Groups}}

{{.Title}}{{range $cmds}}{{if (and (eq .GroupID $group.ID) (or .IsAvailableCommand (eq .Name "help")))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{end}}{{end}}{{if .HasAvailableLocalFlags}}

Flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableSubCommands}}

Run "{{.CommandPath}} COMMAND --help" for a command's flags and examples.{{end}}
`

// wrap marks that a command's own code runs: from then on its errors are
// its outcome, mapped to exit codes by report.
func (a *app) wrap(f func(*cobra.Command, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.ran = true
		return f(cmd, args)
	}
}

// usageError is a bad command line (exit 2).
type usageError string

func (e usageError) Error() string { return string(e) }

func usageErr(format string, a ...any) error { return usageError(fmt.Sprintf(format, a...)) }

// exitErr carries an exit code and a message (empty: print nothing).
type exitErr struct {
	code int
	msg  string
}

func (e *exitErr) Error() string { return e.msg }

// report prints err in a sentence (a JSON object with -o json) and maps
// it to an exit code.
func (a *app) report(err error, cmd *cobra.Command) int {
	if a.out == nil && cmd != nil {
		// An error before the command checked its flags: follow its -o
		// if it parsed.
		if f := cmd.Flags().Lookup("output"); f != nil && f.Value.String() == "json" {
			a.out = &output{format: "json"}
		}
	}
	code, msg := classify(err)
	if msg == "" {
		return code
	}
	if code == exitUsage && cmd != nil {
		msg += "\nRun \"" + cmd.CommandPath() + " --help\" for usage."
	}
	a.out.message(a.stderr, "error", msg, code)
	return code
}

// classify maps err to an exit code and its sentence.
func classify(err error) (int, string) {
	if err == nil {
		return exitOK, ""
	}
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage, string(ue)
	}
	var ee *exitErr
	if errors.As(err, &ee) {
		return ee.code, ee.msg
	}
	code, msg := exitError, err.Error()
	var se *client.ServerError
	switch {
	case errors.Is(err, client.ErrUnauthenticated):
		code = exitUnauthenticated
		msg += "; lockctl authenticates with --identity and --secret-file (or " + envIdentity + " and " + envSecretFile + "), or with a client certificate whose name is an identity (--tls-cert, --tls-key)"
	case errors.Is(err, client.ErrPermissionDenied):
		code = exitPermissionDenied
	case errors.Is(err, client.ErrIndeterminate):
		code, msg = exitIndeterminate, "outcome indeterminate: the lock may or may not have been granted; it will be freed at the latest when its lease ends ("+err.Error()+")"
	case errors.Is(err, client.ErrNoConnection):
		msg = "no connection to lockd"
		if cause := errors.Unwrap(err); cause != nil {
			msg += ": " + cause.Error()
		}
		switch {
		case errors.Is(err, client.ErrTLS):
			msg += tlsHint(err)
		case !errors.Is(err, client.ErrRejected):
			msg += "; is it running? addresses come from --addr or LOCKD_ADDRS"
		}
	case errors.Is(err, client.ErrTimeout):
		code, msg = exitTimeout, "timed out: the lock is held by someone else ("+err.Error()+")"
	case errors.Is(err, client.ErrBusy):
		code, msg = exitBusy, "server busy: its wait queue or key capacity is full ("+err.Error()+")"
	case errors.Is(err, client.ErrNotHeld):
		code, msg = exitNotHeld, "not held: the token is not a current holder of the key (released, or its lease ended)"
	case errors.Is(err, client.ErrLimitMismatch):
		code, msg = exitLimitMismatch, "limit mismatch: the key is held with another limit; every run --shared of a key must give the same N ("+err.Error()+")"
	case errors.Is(err, client.ErrUnsupported):
		msg = err.Error() + "; shared locks, validate, watch and inspect need a lockd that speaks PROTOCOL.md §9"
	case errors.Is(err, context.DeadlineExceeded):
		msg = "no answer within --timeout (" + err.Error() + ")"
	case errors.As(err, &se):
		msg = "server rejected the request: " + se.Msg
	case errors.Is(err, client.ErrInvalidKey), errors.Is(err, client.ErrInvalidLease), errors.Is(err, client.ErrInvalidWait), errors.Is(err, client.ErrInvalidLimit):
		code = exitUsage
	}
	return code, msg
}

// tlsHint names the TLS flag that a TLS failure points to.
func tlsHint(err error) string {
	var rhe tls.RecordHeaderError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	msg := err.Error()
	switch {
	case strings.Contains(msg, "speaks TLS"):
		return "; connect with TLS: --tls-ca FILE (the CA that signed lockd's certificate), or --tls for the system's roots"
	case strings.Contains(msg, "certificate required"):
		return "; lockd requires a client certificate (mutual TLS): --tls-cert FILE and --tls-key FILE"
	case strings.Contains(msg, "refused the TLS connection"):
		return "; lockd did not accept the client certificate: --tls-cert must be signed by a CA of its --tls-client-ca"
	case errors.As(err, &rhe):
		return "; the server does not speak TLS there: drop --tls and the --tls-* flags, or check --addr"
	case errors.As(err, &ua):
		return "; --tls-ca must name the CA that signed lockd's certificate"
	case errors.As(err, &he):
		return "; lockd's certificate does not name this host: --tls-server-name NAME gives the name it carries"
	}
	return "; check the --tls-* flags"
}

// notAcquireErr words an indeterminate release or renew for what it is
// (exitError's table speaks of acquires).
func notAcquireErr(op string, err error) error {
	if errors.Is(err, client.ErrIndeterminate) {
		return &exitErr{code: exitIndeterminate, msg: "outcome indeterminate: the " + op + " may or may not have been executed (" + err.Error() + ")"}
	}
	return err
}

func parseToken(s string) (uint64, error) {
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil || t == 0 {
		return 0, usageErr("TOKEN %q: want the decimal token printed by acquire", s)
	}
	return t, nil
}
