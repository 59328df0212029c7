package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/server"
)

// newCertsCmd is "hedgekv certs": a CA and certificates for a TLS cluster,
// made with crypto/x509 (no openssl needed).
func newCertsCmd(a *app) *cobra.Command {
	var (
		dir, hosts string
		force      bool
	)
	cmd := &cobra.Command{
		Use:   "certs --dir DIR --hosts HOST[,HOST...]",
		Short: "Make a CA, a store certificate and a client certificate for mutual TLS",
		Long: `Make a new CA (ECDSA P-256) and sign with it a store certificate valid for
--hosts (IP addresses or DNS names the stores are dialed at), usable both to
serve and to dial peers, and a client certificate. Writes DIR/ca.pem,
node.pem, node-key.pem, client.pem and client-key.pem (keys mode 0600) and
prints the flags that use them. The CA's key is not kept. Existing files
are not overwritten without --force: stores running on the old CA would
refuse everything the new one signs.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if strings.TrimSpace(dir) == "" {
				return usagef("--dir is required")
			}
			var hs []string
			for _, h := range strings.Split(hosts, ",") {
				if h = strings.TrimSpace(h); h != "" {
					hs = append(hs, h)
				}
			}
			if len(hs) == 0 {
				return usagef("--hosts names no host")
			}
			files, err := server.GenerateCerts(dir, hs, force)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "wrote %s, %s, %s, %s, %s\n", files.CA, files.Node, files.NodeKey, files.Client, files.ClientKey)
			fmt.Fprintf(a.stdout, "server flags: --tls-cert %s --tls-key %s --tls-ca %s\n", files.Node, files.NodeKey, files.CA)
			fmt.Fprintf(a.stdout, "client flags: --tls-cert %s --tls-key %s --tls-ca %s\n", files.Client, files.ClientKey, files.CA)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory to write the certificates to (created)")
	f.StringVar(&hosts, "hosts", "127.0.0.1,localhost", "comma-separated IP addresses and DNS names the store certificate is valid for")
	f.BoolVar(&force, "force", false, "replace existing files (a new CA)")
	return cmd
}
