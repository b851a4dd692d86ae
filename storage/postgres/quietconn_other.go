//go:build !linux

package postgres

import "github.com/jackc/pgx/v5/pgconn"

// quietDial leaves dial as it is: the raw socket calls that keep the Go
// scheduler's monitor asleep are written for Linux only.
func quietDial(dial pgconn.DialFunc) pgconn.DialFunc { return dial }
