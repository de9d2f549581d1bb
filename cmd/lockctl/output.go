package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// output is a command's -o: text (the default) or json. With json, a
// command's result is one JSON document on stdout, and every message it
// prints on stderr (errors, run's warnings) is one JSON object per line:
// {"level": "error"|"warning", "msg": "…", "exit_code": N}.
type output struct {
	format string
}

// register adds -o/--output to cmd and makes it the app's output once
// parsed.
func (a *app) outputFlag(cmd *cobra.Command) *output {
	o := &output{}
	cmd.Flags().StringVarP(&o.format, "output", "o", "text", "output format: text or json")
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"text\tlines for people", "json\tone JSON document"}, cobra.ShellCompDirectiveNoFileComp
	})
	return o
}

// check validates the flag; on success the app's messages follow it.
func (a *app) checkOutput(o *output) error {
	switch o.format {
	case "text", "json":
		a.out = o
		return nil
	}
	return usageErr("-o %q: want text or json", o.format)
}

func (o *output) json() bool { return o != nil && o.format == "json" }

// result prints a command's result: text as it is, or v as JSON.
func (o *output) result(w io.Writer, text string, v any) error {
	if !o.json() {
		_, err := fmt.Fprint(w, text)
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// message is one line on stderr: "lockctl: msg", or a JSON object.
func (o *output) message(w io.Writer, level, msg string, code int) {
	if !o.json() {
		fmt.Fprintf(w, "lockctl: %s\n", msg)
		return
	}
	m := struct {
		Level    string `json:"level"`
		Msg      string `json:"msg"`
		ExitCode *int   `json:"exit_code,omitempty"`
	}{Level: level, Msg: msg}
	if level == "error" {
		m.ExitCode = &code
	}
	b, _ := json.Marshal(m)
	fmt.Fprintf(w, "%s\n", b)
}

// warn prints a warning that does not end the command.
func (a *app) warn(format string, args ...any) {
	a.out.message(a.stderr, "warning", fmt.Sprintf(format, args...), 0)
}
