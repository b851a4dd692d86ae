package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
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
		Use:   "cancel ID | cancel --workflow W --status S [--older-than D] [--all]",
		Short: "Cancel an instance, or every instance a filter picks; running handlers see their context cancelled within a heartbeat",
		Args:  idOrSelection(&sel, "cancel ID, or cancel --workflow W --status S [--older-than D] [--all]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if len(args) == 0 {
				return c.bulk(ctx, &sel, "cancel", "cancelled", false, (*dagrun.Engine).CancelSelected)
			}
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			if err := engine.Cancel(byCLI(ctx), args[0]); err != nil {
				if errors.Is(err, storage.ErrConflict) {
					return conflictError(ctx, engine, args[0], "already ", "only a pending or running instance can be cancelled", err)
				}
				return c.instanceError(args[0], err)
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
				return usageError(view.AgeError("--older-than", olderThan, err))
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
			noun := "instances"
			if n == 1 {
				noun = "instance"
			}
			fmt.Fprintf(c.io.Stdout, "%s %d finished %s older than %s\n", verb, n, noun, olderThan)
			return nil
		},
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "delete instances that finished longer ago than this: 30d, 2w, 12h")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only count what would be deleted")
	return cmd
}

// parseAge parses a duration that may also count whole days and weeks:
// see view.ParseAge.
func parseAge(s string) (time.Duration, error) { return view.ParseAge(s) }
