package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

// logsPoll is how often `logs --follow` looks for new records.
const logsPoll = 300 * time.Millisecond

// logsSettle is how long `logs --follow` keeps reading once the instance
// finished: its last records are written shortly after its last step.
const logsSettle = time.Second

func (c *cli) logsCommand() *cobra.Command {
	var (
		follow  bool
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "logs ID [STEP]",
		Short: "Print what an instance's handlers logged, of every step or one, and with --follow go on while it runs",
		Long: "Logs prints the records handlers logged through handlers.Logger, one line each: time, level, step#attempt\n" +
			"(step[item]#attempt for an item of a forEach step), message and attributes. Each attempt keeps its last\n" +
			"64 KiB; a line says how much was dropped before. With --follow it prints new records as they are written\n" +
			"until the instance finishes.",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usageError(fmt.Errorf("usage: dagrun logs ID [STEP] [--follow] [--json] (got %s)", argumentCount(len(args))))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			store, err := c.openLogStore(ctx)
			if err != nil {
				return err
			}
			step := ""
			if len(args) == 2 {
				step = args[1]
			}
			return c.printLogs(ctx, store, args[0], step, follow, jsonOut)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&follow, "follow", false, "keep printing new records until the instance finishes")
	f.BoolVar(&jsonOut, "json", false, "print one JSON object per record")
	return cmd
}

// openLogStore opens the store alone, a one-off command's (conns zero):
// reading logs needs no workflows.
func (c *cli) openLogStore(ctx context.Context) (storage.Store, error) {
	store, err := c.openCommandStore(ctx, 0)
	if err != nil {
		return nil, err
	}
	c.cleanup = func() { _ = store.Close() }
	return store, nil
}

// logsScope names what logs read, for a message about it.
func logsScope(step string) string {
	if step == "" {
		return ""
	}
	return " of step " + step
}

func (c *cli) printLogs(ctx context.Context, store storage.Store, id, step string, follow, jsonOut bool) error {
	var (
		after   int64
		settled time.Time // when the instance was first seen finished
	)
	for {
		inst, records, err := view.LoadLogs(ctx, store, id, step, after, view.MaxLogLimit)
		var noStep *view.StepNotFoundError
		switch {
		case errors.As(err, &noStep):
			return usageError(err)
		case err != nil:
			return c.instanceError(id, err)
		}
		for _, r := range records {
			if jsonOut {
				err = json.NewEncoder(c.io.Stdout).Encode(view.NewLogRecords([]storage.LogRecord{r})[0])
			} else {
				err = view.WriteLogLine(c.io.Stdout, r)
			}
			if err != nil {
				return err
			}
			after = r.Seq
		}
		if len(records) == view.MaxLogLimit {
			continue // more already there
		}
		if !follow {
			if after == 0 && !jsonOut {
				// Said on stderr, so that stdout stays the records alone.
				if inst.Status.Finished() {
					fmt.Fprintf(c.io.Stderr, "no log records%s: its handlers logged nothing (they log through handlers.Logger(ctx))\n", logsScope(step))
				} else {
					fmt.Fprintf(c.io.Stderr, "no log records%s yet (handlers log through handlers.Logger(ctx)); add --follow to wait for them\n", logsScope(step))
				}
			}
			return nil
		}
		if inst.Status.Finished() {
			if settled.IsZero() {
				settled = time.Now()
			} else if time.Since(settled) >= logsSettle {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			if inst.Status.Finished() {
				return nil // all there will be is printed
			}
			// Interrupted before the instance finished: what was there is
			// printed, but not all there will be.
			return &exitError{code: ExitInterrupted}
		case <-time.After(logsPoll):
		}
	}
}
