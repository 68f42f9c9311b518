export * from './context/theme';
export * from './keypress';
