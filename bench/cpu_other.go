//go:build !unix

package bench

// selfCPUSeconds is not measured here.
func selfCPUSeconds() float64 { return 0 }
