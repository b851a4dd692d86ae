package view

import (
	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// Schedule is one schedule of `dagrun schedules --json` and of GET
// /api/schedules. Field names and shapes are part of the public contract.
type Schedule struct {
	Workflow string `json:"workflow"`
	// Index is the schedule's position in the workflow's schedule: list,
	// from 0: what pause and resume name.
	Index    int    `json:"index"`
	Cron     string `json:"cron"`
	Timezone string `json:"timezone"`
	Overlap  string `json:"overlap"`
	// Catchup is a Go duration written as in workflow files (1h, not
	// 1h0m0s); "0s" when absent.
	Catchup string `json:"catchup"`
	Paused  bool   `json:"paused"`
	// Next are the next fire times, RFC 3339 in UTC.
	Next []string `json:"next"`
	// LastInstance is the instance the schedule started last; null before
	// the first.
	LastInstance *ScheduledInstance `json:"lastInstance"`
	Fired        int64              `json:"fired"`
	Skipped      int64              `json:"skipped"`
}

// ScheduledInstance names an instance a schedule started. Status is null
// once the instance was pruned.
type ScheduledInstance struct {
	ID     string  `json:"id"`
	Status *string `json:"status"`
}

// NewSchedules converts the engine's schedule list to its public shape.
func NewSchedules(list []dagrun.ScheduleInfo) []Schedule {
	out := make([]Schedule, len(list))
	for i, s := range list {
		v := Schedule{
			Workflow: s.Workflow,
			Index:    s.Index,
			Cron:     s.Cron,
			Timezone: s.Timezone,
			Overlap:  string(s.Overlap),
			Catchup:  storage.FormatDuration(s.Catchup),
			Paused:   s.Paused,
			Next:     make([]string, len(s.Next)),
			Fired:    s.Fired,
			Skipped:  s.Skipped,
		}
		for j, t := range s.Next {
			v.Next[j] = Time(t)
		}
		if s.LastInstanceID != "" {
			v.LastInstance = &ScheduledInstance{ID: s.LastInstanceID}
			if s.LastInstanceStatus != "" {
				status := string(s.LastInstanceStatus)
				v.LastInstance.Status = &status
			}
		}
		out[i] = v
	}
	return out
}
