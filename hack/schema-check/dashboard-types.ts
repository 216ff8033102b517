// The type every generated dashboard must satisfy: @grafana/schema's
// Dashboard, with each panel's options and field config checked against its
// plugin's schema (the plain Dashboard type leaves both as records).
//
// check.sh writes one file per dashboard that assigns the JSON, as an object
// literal, to ZonewatchDashboard: tsc then reports missing required fields,
// wrong types and (excess-property check) fields the schema does not know.
import type {
  AnnotationContainer,
  AnnotationQuery,
  Dashboard,
  DataQuery,
  FieldConfigSource,
  Panel,
  RowPanel,
} from '@grafana/schema';
import type * as bargauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type * as stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type * as text from '@grafana/schema/dist/esm/raw/composable/text/panelcfg/x/TextPanelCfg_types.gen';
import type * as timeseries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';

// JSON<T> is the JSON form of T. The schema encodes value sets as TypeScript
// string enums (ThresholdsMode.Absolute = "absolute"), which a JSON literal
// can never be: `${E}` turns an enum into the union of its string values.
// Nothing else changes; optional and required properties stay as they are.
export type JSON<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends ReadonlyArray<infer U>
      ? Array<JSON<U>>
      : T extends object
        ? { [K in keyof T]: JSON<T[K]> }
        : T;

type TypedPanel<Type extends string, Options, Custom> = Omit<Panel, 'type' | 'options' | 'fieldConfig'> & {
  type: Type;
  options?: Options;
  fieldConfig?: FieldConfigSource<Custom>;
};

// The panel plugins the generator uses. A new one must be added here.
type ZonewatchPanel =
  | TypedPanel<'stat', stat.Options, Record<string, never>>
  | TypedPanel<'timeseries', timeseries.Options, timeseries.FieldConfig>
  | TypedPanel<'table', table.Options, table.FieldConfig>
  | TypedPanel<'bargauge', bargauge.Options, Record<string, never>>
  | TypedPanel<'text', text.Options, Record<string, never>>;

// ALLOW-LISTED: the Prometheus annotation fields. Grafana's Prometheus data
// source reads the query from `target` (a PromQuery: expr, interval) and
// formats events with titleFormat, textFormat, tagKeys and useValueForTime
// on the annotation itself (grafana-prometheus/src/annotations.ts). The
// schema types annotations generically (AnnotationQuery<DataQuery>), so it
// declares none of these; they are the only fields added to the schema here.
interface PrometheusAnnotationQuery extends Omit<AnnotationQuery, 'target'> {
  target?: DataQuery & { expr: string; interval?: string };
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
}

export type ZonewatchDashboard = JSON<
  Omit<Dashboard, 'panels' | 'annotations'> & {
    panels?: Array<ZonewatchPanel | (Omit<RowPanel, 'panels'> & { panels: ZonewatchPanel[] })>;
    annotations?: Omit<AnnotationContainer, 'list'> & { list?: PrometheusAnnotationQuery[] };
  }
>;
