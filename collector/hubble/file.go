package hubble

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// maxLine bounds one JSON line; longer lines are bad lines, not a failure.
const maxLine = 4 << 20

// maxLineErrors is how many bad lines ReadStats keeps for the report.
const maxLineErrors = 10

// LineError is a bad line of a flow file.
type LineError struct {
	Line int
	Err  error
}

func (e LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// ReadStats says what a flow file held.
type ReadStats struct {
	Lines      int    // non-empty lines
	Flows      int    // flows handed to fn
	LostEvents uint64 // events reported lost by lost_events lines
	Other      int    // valid lines that are neither (node_status)
	Bad        int    // lines that are not a flow response or a flow
	Errors     []LineError
}

var jsonOpts = protojson.UnmarshalOptions{DiscardUnknown: true}

// ReadFlows reads `hubble observe -o jsonpb` / `-o json` output: one JSON
// object per line, either a GetFlowsResponse ({"flow": {...}},
// {"lost_events": {...}}) or a bare Flow. It calls fn for every flow; f is
// reused after fn returns. Bad lines are counted in the stats and skipped;
// the error is only a read error of r.
func ReadFlows(r io.Reader, fn func(f *flowpb.Flow)) (ReadStats, error) {
	var st ReadStats
	br := bufio.NewReaderSize(r, 64<<10)
	resp := &observerpb.GetFlowsResponse{}
	bare := &flowpb.Flow{}
	var long []byte
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		tooLong := false
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				if len(long) <= maxLine {
					long = append(long, line...)
				}
			}
			tooLong = len(long) > maxLine
			line = long
		}
		if len(bytes.TrimSpace(line)) > 0 {
			st.Lines++
			if tooLong {
				st.bad(n, fmt.Errorf("line longer than %d bytes", maxLine))
			} else {
				st.line(n, line, resp, bare, fn)
			}
		}
		if err == io.EOF {
			return st, nil
		}
		if err != nil {
			return st, fmt.Errorf("reading flows after line %d: %w", n, err)
		}
	}
}

func (st *ReadStats) line(n int, line []byte, resp *observerpb.GetFlowsResponse, bare *flowpb.Flow, fn func(*flowpb.Flow)) {
	proto.Reset(resp)
	if err := jsonOpts.Unmarshal(line, resp); err != nil {
		st.bad(n, err)
		return
	}
	switch {
	case resp.GetFlow() != nil:
		st.Flows++
		fn(resp.GetFlow())
		return
	case resp.GetLostEvents() != nil:
		st.LostEvents += resp.GetLostEvents().GetNumEventsLost()
		return
	case resp.GetNodeStatus() != nil:
		st.Other++
		return
	}
	// Not a response: a bare Flow (older `hubble observe -o json`).
	proto.Reset(bare)
	if err := jsonOpts.Unmarshal(line, bare); err != nil {
		st.bad(n, err)
		return
	}
	if bare.GetVerdict() == flowpb.Verdict_VERDICT_UNKNOWN && bare.GetIP() == nil && bare.GetSource() == nil && bare.GetDestination() == nil {
		st.bad(n, errors.New("neither a flow response nor a flow"))
		return
	}
	st.Flows++
	fn(bare)
}

func (st *ReadStats) bad(n int, err error) {
	st.Bad++
	if len(st.Errors) < maxLineErrors {
		st.Errors = append(st.Errors, LineError{Line: n, Err: err})
	}
}
