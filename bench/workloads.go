package bench

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The property sets of go-ycsb v1.0.1's workloads/workload{a..f}, embedded so
// that nothing depends on files on disk. recordcount and operationcount are
// left out: Spec sets them. go-ycsb's sets differ from the Java YCSB ones in
// places (uniform request distribution for a-c, maxscanlength=1 for e); they
// are kept as go-ycsb ships them, and Spec.MaxScanLength overrides e's.
var workloadSets = map[string]map[string]string{
	// Update heavy: 50/50 reads and updates.
	"a": {
		"workload":            "core",
		"readallfields":       "true",
		"readproportion":      "0.5",
		"updateproportion":    "0.5",
		"scanproportion":      "0",
		"insertproportion":    "0",
		"requestdistribution": "uniform",
	},
	// Read mostly: 95/5 reads and updates.
	"b": {
		"workload":            "core",
		"readallfields":       "true",
		"readproportion":      "0.95",
		"updateproportion":    "0.05",
		"scanproportion":      "0",
		"insertproportion":    "0",
		"requestdistribution": "uniform",
	},
	// Read only.
	"c": {
		"workload":            "core",
		"readallfields":       "true",
		"readproportion":      "1",
		"updateproportion":    "0",
		"scanproportion":      "0",
		"insertproportion":    "0",
		"requestdistribution": "uniform",
	},
	// Read latest: 95% reads of recently inserted records, 5% inserts.
	"d": {
		"workload":            "core",
		"readallfields":       "true",
		"readproportion":      "0.95",
		"updateproportion":    "0",
		"scanproportion":      "0",
		"insertproportion":    "0.05",
		"requestdistribution": "latest",
	},
	// Short ranges: 95% scans, 5% inserts.
	"e": {
		"workload":               "core",
		"readallfields":          "true",
		"readproportion":         "0",
		"updateproportion":       "0",
		"scanproportion":         "0.95",
		"insertproportion":       "0.05",
		"requestdistribution":    "uniform",
		"maxscanlength":          "1",
		"scanlengthdistribution": "uniform",
	},
	// Read-modify-write: 50% reads, 50% read-modify-writes.
	"f": {
		"workload":                  "core",
		"readallfields":             "true",
		"readproportion":            "0.5",
		"updateproportion":          "0",
		"scanproportion":            "0",
		"insertproportion":          "0",
		"readmodifywriteproportion": "0.5",
		"requestdistribution":       "uniform",
	},
	// Scan only (the follower-read experiments' workload): 100% scans, or
	// 95% scans and 5% inserts with Spec.ScanInsert. maxscanlength comes
	// from Spec.MaxScanLength (default DefaultMaxScanLength).
	"scan": {
		"workload":               "core",
		"readallfields":          "true",
		"readproportion":         "0",
		"updateproportion":       "0",
		"scanproportion":         "1",
		"insertproportion":       "0",
		"requestdistribution":    "uniform",
		"scanlengthdistribution": "uniform",
	},
}

// DefaultMaxScanLength is the scan workload's maxscanlength unless
// Spec.MaxScanLength says otherwise.
const DefaultMaxScanLength = 100

// Workloads lists the workload names Spec.Workload accepts.
func Workloads() []string {
	return slices.Sorted(maps.Keys(workloadSets))
}

// WorkloadProperties returns a copy of a workload's property set.
func WorkloadProperties(name string) (map[string]string, error) {
	set, ok := workloadSets[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return nil, fmt.Errorf("unknown workload %q (want one of %s)", name, strings.Join(Workloads(), ", "))
	}
	return maps.Clone(set), nil
}
