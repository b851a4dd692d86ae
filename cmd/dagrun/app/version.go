package app

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// buildVersion is what the binary knows of its own build: the version of
// the main module (a tag when installed with `go install ...@v1.2.3`,
// "(devel)" when built from a checkout), the commit a checkout build came
// from and whether it had uncommitted changes, and the Go version. A
// user's own binary reports its own module, which is the build to name in
// a bug report.
type buildVersion struct {
	Module     string `json:"module"`
	Version    string `json:"version"`
	Commit     string `json:"commit,omitempty"`
	CommitTime string `json:"commitTime,omitempty"`
	Modified   bool   `json:"modified,omitempty"`
	Go         string `json:"go"`
}

func readBuildVersion() buildVersion {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return buildVersion{Version: "unknown"}
	}
	v := buildVersion{Module: info.Main.Path, Version: info.Main.Version, Go: info.GoVersion}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// String is the one line `dagrun version` and `dagrun --version` print.
func (v buildVersion) String() string {
	var b strings.Builder
	b.WriteString("dagrun " + v.Version)
	if v.Commit != "" {
		fmt.Fprintf(&b, ", commit %.12s", v.Commit)
		if v.CommitTime != "" {
			b.WriteString(" of " + v.CommitTime)
		}
		if v.Modified {
			b.WriteString(" with uncommitted changes")
		}
	}
	if v.Module != "" && v.Module != "github.com/dagrun/dagrun" {
		b.WriteString(", built as " + v.Module)
	}
	if v.Go != "" {
		b.WriteString(", " + v.Go)
	}
	return b.String()
}

func (c *cli) versionCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print this binary's version, the commit it was built from and its Go version",
		Args:  exactArgs(0, "version [--json]"),
		RunE: func(*cobra.Command, []string) error {
			v := readBuildVersion()
			if asJSON {
				return writeJSON(c.io.Stdout, v)
			}
			_, err := fmt.Fprintln(c.io.Stdout, v)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the version as a JSON object")
	return cmd
}
