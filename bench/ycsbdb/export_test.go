package ycsbdb

// SetScanPage sets the per-RPC scan limit and returns a func restoring it.
func SetScanPage(n int) (restore func()) {
	old := scanPage
	scanPage = n
	return func() { scanPage = old }
}
