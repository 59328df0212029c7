//go:build !unix

package bench

import "os"

// terminalWidth is the width of the terminal f is, 0 if unknown.
func terminalWidth(*os.File) int { return 0 }
