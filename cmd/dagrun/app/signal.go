package app

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

const signalUsage = "signal ID NAME [--data JSON|@FILE|-] [--id SIGNAL_ID], or signal --workflow W --key KEY NAME ..."

func (c *cli) signalCommand() *cobra.Command {
	var (
		data, signalID, workflow, key string
	)
	cmd := &cobra.Command{
		Use:   "signal ID NAME",
		Short: "Send a signal to an instance: its wait step waiting for NAME completes with the data as output",
		Long: "Signal completes the wait step of instance ID that waits for the signal NAME, with the data as its output,\n" +
			"or stores the signal until that step waits. Name the instance by its workflow and idempotency key instead\n" +
			"with --workflow and --key. A signal is taken once: sending it again is a conflict (exit 1), unless it\n" +
			"carries the same --id as the first, which changes nothing (exit 0).",
		Args: func(cmd *cobra.Command, args []string) error {
			want := 2
			if workflow != "" || key != "" {
				want = 1
				if workflow == "" || key == "" {
					return usageError(errors.New("--workflow and --key go together: they name the instance started with that key"))
				}
				if len(args) == 2 {
					return usageError(errors.New("name the instance once: by its ID, or by --workflow and --key, not both"))
				}
			}
			return exactArgs(want, signalUsage)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			req := dagrun.SignalRequest{Workflow: workflow, Key: key, ID: signalID, Name: args[len(args)-1]}
			if len(args) == 2 {
				req.InstanceID = args[0]
			}
			if data != "" {
				raw, err := c.readJSONFlag("--data", data)
				if err != nil {
					return usageError(err)
				}
				req.Data = raw
			}
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			res, err := engine.Signal(byCLI(ctx), req)
			if err != nil {
				return signalError(req, withJSONHint("--data", err))
			}
			fmt.Fprintln(c.io.Stdout, signalOutcome(req, res))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "the signal's payload: JSON, @FILE, or - for standard input (default null)")
	f.StringVar(&signalID, "id", "", "the signal's own ID (a webhook's event ID, say): sending it again with the same ID changes nothing")
	f.StringVar(&workflow, "workflow", "", "with --key: the workflow of the instance to signal")
	f.StringVar(&key, "key", "", "with --workflow: the idempotency key the instance was started with")
	return cmd
}

// signalOutcome says what became of a signal.
func signalOutcome(req dagrun.SignalRequest, res dagrun.SignalResult) string {
	switch {
	case res.Duplicate:
		return fmt.Sprintf("signal %s with ID %s was already sent to instance %s: nothing changed", req.Name, view.QuoteShort(req.ID), res.InstanceID)
	case res.Delivered:
		return fmt.Sprintf("delivered signal %s to instance %s", req.Name, res.InstanceID)
	default:
		return fmt.Sprintf("stored signal %s for instance %s: its step takes it when it starts waiting", req.Name, res.InstanceID)
	}
}

// signalError maps a refused signal to its exit code: a conflict exits 1
// (the signal was taken before, or the instance is finished), a bad
// instance, name or payload 2, storage 3.
func signalError(req dagrun.SignalRequest, err error) error {
	var (
		unknown *dagrun.UnknownSignalError
		bad     *dagrun.SignalDataError
		badArg  *dagrun.ArgumentError
	)
	switch {
	case errors.Is(err, storage.ErrUnavailable):
		return err
	case errors.Is(err, storage.ErrConflict):
		return &exitError{code: ExitFailed, err: err}
	case errors.As(err, &unknown), errors.As(err, &bad), errors.As(err, &badArg):
		return usageError(err)
	case errors.Is(err, storage.ErrNotFound) && req.InstanceID != "":
		return instanceError(req.InstanceID, err)
	case errors.Is(err, storage.ErrNotFound):
		return usageError(fmt.Errorf("no instance of workflow %s was started with key %s (start it with: dagrun start %s --key KEY)",
			req.Workflow, view.QuoteShort(req.Key), req.Workflow))
	}
	return err
}
