package app

import (
	"context"
	"errors"
	"fmt"
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
	return &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel an instance; running handlers see their context cancelled within a heartbeat",
		Args:  exactArgs(1, "cancel ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			if err := engine.Cancel(ctx, args[0]); err != nil {
				if errors.Is(err, storage.ErrConflict) {
					return conflictError(ctx, engine, args[0], "already ", "only a pending or running instance can be cancelled", err)
				}
				return instanceError(args[0], err)
			}
			fmt.Fprintf(c.io.Stdout, "cancelled %s\n", args[0])
			return nil
		},
	}
}

func (c *cli) pruneCommand() *cobra.Command {
	var (
		olderThan string
		dryRun    bool
	)
	cmd := &cobra.Command{
		Use:   "prune --older-than DUR",
		Short: "Delete finished instances (with their steps and history) older than DUR",
		Args:  exactArgs(0, "prune --older-than DUR [--dry-run]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan == "" {
				return usageError(errors.New("prune needs --older-than, e.g. --older-than 720h"))
			}
			d, err := time.ParseDuration(olderThan)
			if err != nil || d < 0 {
				return usageError(fmt.Errorf("invalid --older-than %q: use a duration such as 720h", olderThan))
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
			fmt.Fprintf(c.io.Stdout, "%s %d finished instances older than %s\n", verb, n, d)
			return nil
		},
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "delete instances that finished longer ago than this duration")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only count what would be deleted")
	return cmd
}
