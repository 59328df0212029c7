package bench

import (
	_ "github.com/HdrHistogram/hdrhistogram-go"
	_ "github.com/magiconair/properties"
	_ "github.com/pingcap/go-ycsb/db/etcd"
	_ "github.com/pingcap/go-ycsb/pkg/client"
	_ "github.com/pingcap/go-ycsb/pkg/measurement"
	_ "github.com/pingcap/go-ycsb/pkg/workload"
	_ "go.etcd.io/etcd/client/v3"
)
