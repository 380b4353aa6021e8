// Command inspect-report is the last stage of the inspection example: it
// combines the anomaly reports under /in (every file, in name order, each
// printed by inspect-anomaly) into one JSON summary on stdout.
//
//	inspect-report
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/cyclepool/cyclepool/tasks/internal/inspect"
	"github.com/cyclepool/cyclepool/tasks/internal/taskio"
	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	if len(os.Args) != 1 {
		taskio.Fatal("usage: inspect-report (inputs: anomaly reports)")
	}
	names, err := taskio.ListInputs()
	if err != nil {
		taskio.Fatal("inspect-report: %v", err)
	}
	if len(names) == 0 {
		taskio.Fatal("inspect-report: no reports under /in")
	}
	reports := make([]inspect.AnomalyReport, len(names))
	for i, n := range names {
		b, err := taskio.ReadInput(n)
		if err != nil {
			taskio.Fatal("inspect-report: %v", err)
		}
		if err := json.Unmarshal(b, &reports[i]); err != nil {
			taskio.Fatal("inspect-report: %s: %v", n, err)
		}
		sdk.Progress(0.9 * float64(i+1) / float64(len(names)))
	}
	s := inspect.Combine(reports)
	out, _ := json.MarshalIndent(s, "", "  ")
	fmt.Printf("%s\n", out)
	sdk.Progress(1)
	fmt.Fprintf(os.Stderr, "inspect-report: %d anomalies in %d captures\n", s.AnomaliesTotal, s.Reports)
}
