package dashboards

import "github.com/zonewatch/zonewatch/rules"

// Recording rules are the rule pack's own names (rules.Rec*), so a renamed
// rule cannot leave a dashboard querying the old one. Names follow
// level:metric:operations; every one keeps namespace and job_name unless its
// level says otherwise.
const (
	ruleZones          = rules.RecJobZones
	ruleSplit          = rules.RecJobSplitZone
	rulePods           = rules.RecJobPods
	ruleGPUs           = rules.RecGPUs
	ruleGPUUtil        = rules.RecGPUUtilization
	ruleSMActive       = rules.RecGPUSMActive
	ruleDrops          = rules.RecPolicyDrops
	ruleCrossFlows     = rules.RecCrossZoneFlowEvents
	ruleCrossDropsBy   = rules.RecCrossZonePolicyDrops
	ruleActivity       = rules.RecGPUActivity
	ruleCrossBytes     = rules.RecCrossZoneBytes
	ruleCrossCost      = rules.RecCrossZoneCost
	ruleCrossCostNS    = rules.RecNamespaceCrossZoneCost
	ruleIdleGPUCost    = rules.RecSplitIdleGPUCost
	ruleZonePairRTT    = rules.RecZonePairRTT
	ruleJobPairRTT     = rules.RecJobZonePairRTT
	ruleJobInZoneRTT   = rules.RecJobInZoneRTT
	ruleProbeFailures  = rules.RecProbeFailures
	metricPodInfo      = "zonewatch_job_pod_info"
	metricJobZones     = "zonewatch_job_zones"
	metricDrops        = "zonewatch_job_policy_drops_total"
	metricPeerDrops    = "zonewatch_job_peer_policy_drops_total"
	metricFlows        = "zonewatch_job_flow_events_total"
	metricBytes        = "zonewatch_job_network_bytes_total"
	metricGPUUtil      = "zonewatch_gpu_utilization_ratio"
	metricSMActive     = "zonewatch_gpu_sm_active_ratio"
	metricTensorActive = "zonewatch_gpu_tensor_active_ratio"
)
