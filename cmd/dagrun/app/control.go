package app

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// conflictError explains why an instance cannot take a verb by naming its
// current status, instead of the store's wrapped conflict error.
func conflictError(ctx context.Context, engine *dagrun.Engine, id, prefix, rule string, err error) error {
	inst, getErr := engine.Get(ctx, id)
	if getErr != nil {
		return usageError(err)
	}
	return usageError(fmt.Errorf("instance %s is %s%s; %s", id, prefix, inst.Status, rule))
}

func (c *cli) cancelCommand() *cobra.Command {
	var sel selectionFlags
	cmd := &cobra.Command{
		Use:   "cancel ID | cancel --workflow W --status S [--older-than D]",
		Short: "Cancel an instance, or every instance a filter picks; running handlers see their context cancelled within a heartbeat",
		Args:  idOrSelection(&sel, "cancel ID, or cancel --workflow W --status S [--older-than D]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if len(args) == 0 {
				return c.bulk(ctx, &sel, "cancel", "cancelled", (*dagrun.Engine).CancelSelected)
			}
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			if err := engine.Cancel(byCLI(ctx), args[0]); err != nil {
				if errors.Is(err, storage.ErrConflict) {
					return conflictError(ctx, engine, args[0], "already ", "only a pending or running instance can be cancelled", err)
				}
				return instanceError(args[0], err)
			}
			fmt.Fprintf(c.io.Stdout, "cancelled %s\n", args[0])
			return nil
		},
	}
	sel.register(cmd, "cancel")
	return cmd
}

func (c *cli) pruneCommand() *cobra.Command {
	var (
		olderThan string
		dryRun    bool
	)
	cmd := &cobra.Command{
		Use:   "prune --older-than DUR",
		Short: "Delete finished instances (with their steps and history) older than DUR",
		Long: "Prune deletes the instances that finished longer ago than DUR, with their steps and history.\n" +
			"DUR is a Go duration (12h, 90m) or a number of days or weeks (30d, 2w), which may be combined (1w3d12h).",
		Args: exactArgs(0, "prune --older-than DUR [--dry-run]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan == "" {
				return usageError(errors.New("prune needs --older-than, e.g. --older-than 30d"))
			}
			d, err := parseAge(olderThan)
			if err != nil {
				return usageError(fmt.Errorf("invalid --older-than %q: use a duration such as 30d, 2w or 12h", olderThan))
			}
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			n, err := engine.Store().Prune(ctx, time.Now().Add(-d), dryRun)
			if err != nil {
				return err
			}
			verb := "pruned"
			if dryRun {
				verb = "would prune"
			}
			fmt.Fprintf(c.io.Stdout, "%s %d finished instances older than %s\n", verb, n, olderThan)
			return nil
		},
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "delete instances that finished longer ago than this: 30d, 2w, 12h")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only count what would be deleted")
	return cmd
}

// maxAge keeps now minus the age within what every backend stores.
const maxAge = 100 * 365 * 24 * time.Hour

// parseAge parses a duration that may also count whole days (d) and weeks
// (w), which time.ParseDuration does not know: each NUMBERd or NUMBERw is
// rewritten in hours, and the rest is left to ParseDuration. Neither letter
// is one of its units, so they never clash.
func parseAge(s string) (time.Duration, error) {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.') {
			j++
		}
		if j > i && j < len(s) && (s[j] == 'd' || s[j] == 'w') {
			n, err := strconv.ParseInt(s[i:j], 10, 64)
			if err != nil || n > int64(maxAge/(24*time.Hour)) {
				return 0, fmt.Errorf("%s%c is not a whole number of days or weeks in range", s[i:j], s[j])
			}
			if s[j] == 'w' {
				n *= 7
			}
			b.WriteString(strconv.FormatInt(n*24, 10) + "h")
			i = j + 1
			continue
		}
		if j == i {
			j++
		}
		b.WriteString(s[i:j])
		i = j
	}
	d, err := time.ParseDuration(b.String())
	switch {
	case err != nil:
		return 0, err
	case d < 0 || d > maxAge:
		return 0, fmt.Errorf("%s is out of range", s)
	}
	return d, nil
}
