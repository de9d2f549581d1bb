package main

import (
	"flag"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// envPrefix starts the environment variable of every configuration flag:
// --data-dir is LOCKD_DATA_DIR (envName).
const envPrefix = "LOCKD_"

// notFromEnv are the flags that have no variable: they are actions, not
// configuration (a LOCKD_VERSION left in a deployment's environment must
// not turn the daemon into a command that prints its version and exits).
var notFromEnv = map[string]bool{"version": true}

// otherTools are LOCKD_ variables that belong to lockctl (and what
// `lockctl run` gives its command), not to lockd: envUnknown does not
// report them.
var otherTools = map[string]bool{"LOCKD_ADDRS": true, "LOCKD_IDENTITY": true, "LOCKD_SECRET_FILE": true,
	"LOCKD_KEY": true, "LOCKD_TOKEN": true}

// envName is the variable of flag name: LOCKD_ and the name in upper
// case with '-' as '_'.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// envSet is a flag set from the environment: its variable and value.
type envSet struct{ variable, value string }

// applyEnv sets every flag of fs that the command line did not set and
// whose variable lookup finds (set and empty counts: LOCKD_ADMIN= turns
// the admin endpoint off as --admin "" does). It returns the flags it set,
// by name; a value the flag refuses is a usageError naming the variable
// and the flag. No lockd flag takes a secret (secrets are files:
// --tls-key, --acl's digests), so nothing read here needs hiding.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) (map[string]envSet, error) {
	onCmdLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCmdLine[f.Name] = true })
	set := map[string]envSet{}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || onCmdLine[f.Name] || notFromEnv[f.Name] {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = usageError{fmt.Sprintf("%s=%q (the environment's --%s): %v", name, v, f.Name, e)}
			return
		}
		set[f.Name] = envSet{name, v}
	})
	return set, err
}

// envUnknown returns the LOCKD_ variables of environ that name no flag of
// fs (a misspelt LOCKD_DATADIR would otherwise be ignored in silence),
// leaving out lockctl's, sorted.
func envUnknown(fs *flag.FlagSet, environ []string) []string {
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if !notFromEnv[f.Name] {
			known[envName(f.Name)] = true
		}
	})
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && !known[name] && !otherTools[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// envUsage appends each flag's variable to its usage line, for --help.
func envUsage(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if !notFromEnv[f.Name] {
			f.Usage += " [$" + envName(f.Name) + "]"
		}
	})
}

// withEnv adds to a usage error's message where the flags it names came
// from, when the environment set them: "--max-key 0: ... (--max-key is
// LOCKD_MAX_KEY="0" from the environment)".
func withEnv(msg string, set map[string]envSet) string {
	var notes []string
	for name, e := range set {
		if strings.Contains(msg, e.variable) {
			continue // applyEnv's own message names it
		}
		if regexp.MustCompile(`--` + regexp.QuoteMeta(name) + `([^a-z0-9-]|$)`).MatchString(msg) {
			notes = append(notes, fmt.Sprintf("--%s is %s=%q from the environment", name, e.variable, e.value))
		}
	}
	if len(notes) == 0 {
		return msg
	}
	sort.Strings(notes)
	return msg + " (" + strings.Join(notes, "; ") + ")"
}
