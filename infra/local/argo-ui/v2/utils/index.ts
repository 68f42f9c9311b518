export * from './utils';
export * from './watch';
