package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/hedgekv/hedgekv/region"
)

// statusKeys rewrites the region boundaries in /status's JSON from
// protojson's base64 to region.FormatKey's escaped form (the key itself
// when it is printable UTF-8 without a backslash, else \\ and \xHH
// escapes), the one encoding ctl regions, its --json and get/scan -w json
// use, so that a key reads the same wherever it is shown. The rest of the
// document is left as protojson wrote it (uint64s as strings included).
func statusKeys(body []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("status json: %w", err)
	}
	regions, _ := doc["regions"].([]any)
	for _, ri := range regions {
		info, _ := ri.(map[string]any)
		r, _ := info["region"].(map[string]any)
		for _, field := range []string{"start_key", "end_key"} {
			s, ok := r[field].(string)
			if !ok {
				continue
			}
			key, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, fmt.Errorf("status json: region %s: %w", field, err)
			}
			r[field] = region.FormatKey(key)
		}
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("status json: %w", err)
	}
	return out, nil
}
