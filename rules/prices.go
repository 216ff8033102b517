package rules

// Prices are what a cloud bills for data crossing a zone or a region
// boundary, per GB (10^9 bytes) counted once at the sender, as zonewatch
// counts them. Where a cloud bills both the sending and the receiving side,
// the price here is the sum.
type Prices struct {
	CrossZoneDollarsPerGB   float64
	CrossRegionDollarsPerGB float64
	// BothDirections says the cloud bills the receiver too (already summed
	// into the price above).
	BothDirections bool
	// Source and Checked say where the figures come from and when they
	// were read; docs/cost.md lists them and a test keeps both in step.
	Source, Checked string
}

// DefaultPricePreset is the preset of the committed rule files: Google
// Cloud's, the lowest non-zero inter-zone price of the three, so a default
// install does not overstate a bill. AWS users set the aws preset's prices.
const DefaultPricePreset = "gcp"

// PricePresets are the published list prices of the big clouds for VM
// traffic inside and between their North American regions. Discounts,
// private pricing and other regions differ: set the chart values
// rules.crossZoneDollarsPerGB / rules.crossRegionDollarsPerGB.
var PricePresets = map[string]Prices{
	// EC2 "Data Transfer within the same AWS Region": 0.01 USD/GB in each
	// direction between Availability Zones; between US regions 0.02 USD/GB,
	// billed to the sender only.
	"aws": {CrossZoneDollarsPerGB: 0.02, CrossRegionDollarsPerGB: 0.02, BothDirections: true,
		Source: "https://aws.amazon.com/ec2/pricing/on-demand/#Data_Transfer_within_the_same_AWS_Region", Checked: "2026-12-01"},
	// Compute Engine "VM-to-VM data transfer": between zones of one region
	// 0.01 USD/GB, within North America between regions 0.02 USD/GB; egress
	// only.
	"gcp": {CrossZoneDollarsPerGB: 0.01, CrossRegionDollarsPerGB: 0.02,
		Source: "https://cloud.google.com/vpc/network-pricing#vpc-pricing", Checked: "2026-12-01"},
	// Azure stopped billing transfer between availability zones of a region
	// (announced at Build, May 2024); between regions within North America
	// 0.02 USD/GB outbound.
	"azure": {CrossZoneDollarsPerGB: 0, CrossRegionDollarsPerGB: 0.02,
		Source: "https://azure.microsoft.com/en-us/pricing/details/bandwidth/", Checked: "2026-12-01"},
}
