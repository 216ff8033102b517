package dashboards

// Recording rules from the rule pack (rules/). Names follow
// level:metric:operations; every one keeps namespace and job_name unless its
// level says otherwise.
const (
	ruleZones          = "namespace_job_name:zonewatch_job_zones:max"
	ruleSplit          = "namespace_job_name:zonewatch_job_split_zone:max"
	rulePods           = "namespace_job_name_role_zone:zonewatch_job_pods:count"
	ruleGPUs           = "namespace_job_name:zonewatch_gpus:count"
	ruleGPUUtil        = "namespace_job_name:zonewatch_gpu_utilization_ratio:avg"
	ruleSMActive       = "namespace_job_name:zonewatch_gpu_sm_active_ratio:avg"
	ruleDrops          = "namespace_job_name_locality:zonewatch_job_policy_drops:rate5m"
	ruleCrossFlows     = "namespace_job_name:zonewatch_job_cross_zone_flow_events:rate5m"
	ruleCrossDropsBy   = "namespace_job_name_peer_src_zone_dst_zone_policy:zonewatch_job_cross_zone_policy_drops:rate5m"
	ruleActivity       = "namespace_job_name_signal:zonewatch_gpu_activity_ratio:avg"
	ruleCrossBytes     = "namespace_job_name:zonewatch_job_cross_zone_bytes:rate5m"
	ruleCrossCost      = "namespace_job_name:zonewatch_cross_zone_cost_dollars_per_hour:rate5m"
	ruleCrossCostNS    = "namespace:zonewatch_cross_zone_cost_dollars_per_hour:rate5m"
	ruleIdleGPUCost    = "namespace_job_name:zonewatch_split_idle_gpu_cost_dollars_per_hour:sum"
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
